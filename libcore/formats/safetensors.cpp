#include "formats/safetensors.h"


#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "util/error.h"
#include "util/io.h"
#include "util/mapped_file.h"

namespace coli {

using nlohmann::json;

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

namespace {
// Headers of real checkpoints are a few MB at most; refuse absurd lengths
// before allocating anything.
constexpr uint64_t kMaxHeader = 256ull << 20;

}  // namespace

std::map<std::string, TensorView> SafetensorsFile::parse(const std::string& path, const uint8_t* bytes,
                                                         std::size_t file_size) {
  if (file_size < 8) throw Error(path + ": truncated safetensors file (" + std::to_string(file_size) + " bytes, no header)");
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; --i) hlen = hlen << 8 | bytes[i];
  if (hlen > kMaxHeader) throw Error(path + ": corrupt safetensors header: header length " + std::to_string(hlen) + " is implausible");
  if (hlen > file_size - 8)
    throw Error(path + ": truncated safetensors file: header length " + std::to_string(hlen) + " exceeds file size " + std::to_string(file_size));
  const std::size_t data_size = file_size - 8 - hlen;
  const uint8_t* data = bytes + 8 + hlen;

  json hdr;
  try {
    hdr = json::parse(bytes + 8, bytes + 8 + hlen);
  } catch (const json::exception& e) {
    throw Error(path + ": corrupt safetensors header: " + e.what());
  }
  if (!hdr.is_object()) throw Error(path + ": corrupt safetensors header: not a JSON object");

  std::map<std::string, TensorView> out;
  for (auto it = hdr.begin(); it != hdr.end(); ++it) {
    const std::string& name = it.key();
    if (name == "__metadata__") continue;
    const json& v = it.value();
    auto bad = [&](const std::string& why) { return Error(path + ": corrupt safetensors header: tensor '" + name + "': " + why); };
    if (!v.is_object()) throw bad("entry is not an object");
    auto dt = v.find("dtype");
    auto sh = v.find("shape");
    auto of = v.find("data_offsets");
    if (dt == v.end() || !dt->is_string()) throw bad("missing dtype");
    if (sh == v.end() || !sh->is_array()) throw bad("missing shape");
    if (of == v.end() || !of->is_array() || of->size() != 2) throw bad("missing data_offsets");
    TensorView t;
    t.name = name;
    t.file = path;
    if (!parse_dtype(dt->get<std::string>(), &t.dtype)) throw bad("unknown dtype " + dt->get<std::string>());
    uint64_t numel = 1;
    for (const auto& d : *sh) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0) throw bad("shape has a non-integer or negative dimension");
      uint64_t dim = d.get<uint64_t>();
      if (dim != 0 && numel > std::numeric_limits<uint64_t>::max() / dim) throw bad("shape overflows");
      numel *= dim;
      t.shape.push_back(static_cast<int64_t>(dim));
    }
    for (const auto& o : *of)
      if (!o.is_number_unsigned() && !(o.is_number_integer() && o.get<int64_t>() >= 0)) throw bad("data_offsets are not non-negative integers");
    uint64_t b = (*of)[0].get<uint64_t>(), e = (*of)[1].get<uint64_t>();
    if (b > e) throw bad("data_offsets begin > end");
    const uint64_t esz = dtype_size(t.dtype);
    if (numel > std::numeric_limits<uint64_t>::max() / esz) throw bad("byte size overflows");
    if (e - b != numel * esz)
      throw bad("data_offsets span " + std::to_string(e - b) + " bytes but shape " + t.shape_str() + " of " + dtype_name(t.dtype) + " needs " + std::to_string(numel * esz));
    if (e > data_size)
      throw Error(path + ": truncated safetensors file: tensor '" + name + "' ends at byte " + std::to_string(e) + " of a " + std::to_string(data_size) + "-byte data section");
    t.data = data + b;
    t.nbytes = e - b;
    out.emplace(name, std::move(t));
  }
  return out;
}

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path), file_(std::make_unique<MappedFile>(path)) {
  if (file_->size() == 0) throw Error(path + ": truncated safetensors file (0 bytes, no header)");
  tensors_ = parse(path, file_->data(), file_->size());
}

SafetensorsFile::~SafetensorsFile() = default;

const TensorView* SafetensorsFile::find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

SafetensorsArchive::SafetensorsArchive(const std::string& dir) : dir_(dir) {
  namespace fs = std::filesystem;
  const fs::path d(dir);
  if (!fs::is_directory(d)) throw Error(dir + ": not a checkpoint directory");
  const fs::path index = d / "model.safetensors.index.json";
  if (fs::exists(index)) {
    const std::string text = read_text_file(index.string());
    json j;
    try {
      j = json::parse(text);
    } catch (const json::exception& e) {
      throw Error(index.string() + ": corrupt index: " + e.what());
    }
    if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
      throw Error(index.string() + ": corrupt index: no weight_map object");
    std::map<std::string, SafetensorsFile*> by_file;
    for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
      if (!it.value().is_string()) throw Error(index.string() + ": corrupt index: weight_map['" + it.key() + "'] is not a file name");
      const std::string fname = it.value().get<std::string>();
      if (fname.find('/') != std::string::npos || fname == ".." || fname.empty())
        throw Error(index.string() + ": weight_map['" + it.key() + "'] names a file outside the checkpoint: " + fname);
      auto f = by_file.find(fname);
      if (f == by_file.end()) {
        files_.push_back(std::make_unique<SafetensorsFile>((d / fname).string()));
        f = by_file.emplace(fname, files_.back().get()).first;
      }
      const TensorView* t = f->second->find(it.key());
      if (!t) throw Error(f->second->path() + ": missing tensor '" + it.key() + "' listed in " + index.string());
      index_[it.key()] = t;
    }
  } else if (fs::exists(d / "model.safetensors")) {
    files_.push_back(std::make_unique<SafetensorsFile>((d / "model.safetensors").string()));
    for (const auto& [name, t] : files_.back()->tensors()) index_[name] = &t;
  } else {
    throw Error(dir + ": no model.safetensors or model.safetensors.index.json");
  }
}

const TensorView* SafetensorsArchive::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : it->second;
}

std::vector<std::string> SafetensorsArchive::names() const {
  std::vector<std::string> v;
  v.reserve(index_.size());
  for (const auto& kv : index_) v.push_back(kv.first);
  return v;
}

}  // namespace coli
