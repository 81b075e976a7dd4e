#include "tokenizer/tokenizer.h"

#include <utf8proc.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unordered_map>

#include "formats/container.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/utf8.h"
#include "util/error.h"
#include "util/io.h"

namespace coli {

using nlohmann::json;

namespace {

constexpr int kMaxId = 1 << 24;  // larger ids are not a real vocabulary

std::string slurp(const std::string& path) { return read_text_file(path); }

std::string slurp_prefix(const std::string& path, std::size_t n) {
  std::ifstream in(path, std::ios::binary);
  std::string s(n, '\0');
  in.read(s.data(), static_cast<std::streamsize>(n));
  s.resize(static_cast<std::size_t>(in.gcount()));
  return s;
}

std::string type_of(const json& j) { return j.is_object() && j.contains("type") && j["type"].is_string() ? j["type"].get<std::string>() : ""; }

bool is_ascii(std::string_view s) {
  for (unsigned char c : s)
    if (c >= 0x80) return false;
  return true;
}

std::string nfc(std::string_view s) {
  utf8proc_uint8_t* dst = nullptr;
  const utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()), static_cast<utf8proc_ssize_t>(s.size()), &dst,
                                          static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  if (n < 0) return std::string(s);  // cannot happen on valid UTF-8; keep the text
  std::string out(reinterpret_cast<char*>(dst), static_cast<std::size_t>(n));
  std::free(dst);
  return out;
}

}  // namespace

Tokenizer::Tokenizer() {
  static std::atomic<uint64_t> next{1};
  serial_ = next++;
}

Tokenizer::~Tokenizer() = default;

std::unique_ptr<Tokenizer> Tokenizer::load(const std::string& path) {
  namespace fs = std::filesystem;
  std::string tok = path, cfg;
  // A coli container carries the checkpoint's tokenizer files.
  std::string container = fs::is_directory(path) && fs::exists(fs::path(path) / "model.coli") ? (fs::path(path) / "model.coli").string() : path;
  if (fs::is_regular_file(container) && slurp_prefix(container, 8) == "COLICNT1") {
    Container c(container);
    auto t = c.file("tokenizer.json");
    if (!t) throw Error(container + ": the container holds no tokenizer.json (the source checkpoint had none)");
    auto tc = c.file("tokenizer_config.json");
    return from_json(*t, tc ? *tc : std::string_view(), container + ": tokenizer.json");
  }
  if (fs::is_directory(path)) tok = (fs::path(path) / "tokenizer.json").string();
  const fs::path cfg_path = fs::path(tok).parent_path() / "tokenizer_config.json";
  if (fs::exists(cfg_path)) cfg = slurp(cfg_path.string());
  return from_json(slurp(tok), cfg, tok);
}

std::unique_ptr<Tokenizer> Tokenizer::from_json(std::string_view text, std::string_view config_text, const std::string& where) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    throw Error(where + ": not valid JSON: " + e.what());
  }
  if (!j.is_object()) throw Error(where + ": not a JSON object");
  std::unique_ptr<Tokenizer> t(new Tokenizer());
  auto bad = [&](const std::string& field, const std::string& why) { return Error(where + ": " + field + ": " + why); };

  // Model: byte-level BPE only.
  if (!j.contains("model") || type_of(j["model"]) != "BPE") throw bad("model.type", "only \"BPE\" is supported");
  const json& m = j["model"];
  for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (m.contains(k) && m[k].is_string() && !m[k].get<std::string>().empty()) throw bad(std::string("model.") + k, "is not supported");
  if (m.contains("byte_fallback") && m["byte_fallback"] == true) throw bad("model.byte_fallback", "is not supported");
  if (!m.contains("vocab") || !m["vocab"].is_object()) throw bad("model.vocab", "missing");
  std::unordered_map<std::string, int> vocab;
  vocab.reserve(m["vocab"].size());
  int max_id = -1;
  for (auto it = m["vocab"].begin(); it != m["vocab"].end(); ++it) {
    if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0 || it.value().get<int64_t>() >= kMaxId)
      throw bad("model.vocab['" + it.key() + "']", "id out of range");
    const int id = it.value().get<int>();
    vocab.emplace(it.key(), id);
    max_id = std::max(max_id, id);
  }

  // Added tokens.
  if (j.contains("added_tokens") && !j["added_tokens"].is_null()) {
    if (!j["added_tokens"].is_array()) throw bad("added_tokens", "not an array");
    for (const auto& a : j["added_tokens"]) {
      if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer() || !a.contains("content") || !a["content"].is_string())
        throw bad("added_tokens", "entry without id and content");
      const int64_t id = a["id"].get<int64_t>();
      if (id < 0 || id >= kMaxId) throw bad("added_tokens", "id out of range");
      std::string content = a["content"].get<std::string>();
      if (content.empty() || !utf8_is_valid(content)) throw bad("added_tokens[" + std::to_string(id) + "]", "empty or not UTF-8");
      for (const char* k : {"lstrip", "rstrip", "single_word"})
        if (a.contains(k) && a[k] == true) throw bad("added_tokens[" + std::to_string(id) + "]." + k, "is not supported");
      t->added_.push_back({std::move(content), static_cast<int>(id), a.contains("special") && a["special"] == true});
      max_id = std::max(max_id, static_cast<int>(id));
    }
  }
  t->id_bytes_.assign(max_id + 1, std::string());
  t->special_.assign(max_id + 1, 0);
  for (const auto& [s, id] : vocab) t->id_bytes_[id] = byte_level_decode(s);
  for (const auto& a : t->added_) {
    t->id_bytes_[a.id] = a.content;
    t->special_[a.id] = a.special;
  }
  t->added_by_byte_.assign(256, {});
  for (int i = 0; i < static_cast<int>(t->added_.size()); ++i)
    t->added_by_byte_[static_cast<unsigned char>(t->added_[i].content[0])].push_back(i);
  for (auto& v : t->added_by_byte_)
    std::stable_sort(v.begin(), v.end(), [&](int a, int b) { return t->added_[a].content.size() > t->added_[b].content.size(); });
  t->vocab_sorted_.assign(vocab.begin(), vocab.end());
  for (const auto& a : t->added_) t->vocab_sorted_.emplace_back(byte_level_encode(a.content), a.id);
  std::sort(t->vocab_sorted_.begin(), t->vocab_sorted_.end());

  // Single-byte tokens and merges.
  std::vector<int> byte_ids(256, -1);
  for (int b = 0; b < 256; ++b) {
    std::string s;
    utf8_append(s, byte_to_unicode(static_cast<uint8_t>(b)));
    auto it = vocab.find(s);
    if (it != vocab.end()) byte_ids[b] = it->second;
  }
  t->bpe_.set_byte_ids(byte_ids);
  if (!m.contains("merges") || !m["merges"].is_array()) throw bad("model.merges", "missing");
  int rank = 0;
  for (const auto& mg : m["merges"]) {
    std::string a, b;
    if (mg.is_string()) {  // older files: "a b"
      const std::string s = mg.get<std::string>();
      const auto sp = s.find(' ');
      if (sp == std::string::npos) throw bad("model.merges[" + std::to_string(rank) + "]", "not a pair");
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    } else if (mg.is_array() && mg.size() == 2 && mg[0].is_string() && mg[1].is_string()) {
      a = mg[0].get<std::string>();
      b = mg[1].get<std::string>();
    } else {
      throw bad("model.merges[" + std::to_string(rank) + "]", "not a pair");
    }
    auto ia = vocab.find(a), ib = vocab.find(b), ic = vocab.find(a + b);
    if (ia == vocab.end() || ib == vocab.end() || ic == vocab.end())
      throw bad("model.merges[" + std::to_string(rank) + "]", "'" + a + "' + '" + b + "' uses a token missing from the vocabulary");
    t->bpe_.add_merge(ia->second, ib->second, ic->second, rank);
    ++rank;
  }

  // Normalizer: none or NFC (alone or in a Sequence).
  if (j.contains("normalizer") && !j["normalizer"].is_null()) {
    const json& n = j["normalizer"];
    std::vector<const json*> parts;
    if (type_of(n) == "Sequence" && n.contains("normalizers") && n["normalizers"].is_array())
      for (const auto& x : n["normalizers"]) parts.push_back(&x);
    else parts.push_back(&n);
    for (const json* p : parts) {
      if (type_of(*p) == "NFC") t->nfc_ = true;
      else throw bad("normalizer", "type \"" + type_of(*p) + "\" is not supported (only NFC)");
    }
  }

  // Pre-tokenizer: Split(regex, Isolated) + ByteLevel(use_regex false), or ByteLevel(use_regex true).
  if (!j.contains("pre_tokenizer") || j["pre_tokenizer"].is_null()) throw bad("pre_tokenizer", "missing (byte-level BPE needs one)");
  {
    const json& p = j["pre_tokenizer"];
    std::vector<const json*> parts;
    if (type_of(p) == "Sequence" && p.contains("pretokenizers") && p["pretokenizers"].is_array())
      for (const auto& x : p["pretokenizers"]) parts.push_back(&x);
    else parts.push_back(&p);
    std::string pattern;
    bool byte_level = false;
    for (const json* x : parts) {
      const std::string ty = type_of(*x);
      if (ty == "Split") {
        if (!pattern.empty()) throw bad("pre_tokenizer", "more than one Split is not supported");
        const json& pat = (*x).value("pattern", json());
        if (pat.is_object() && pat.contains("Regex") && pat["Regex"].is_string()) pattern = pat["Regex"].get<std::string>();
        else throw bad("pre_tokenizer.Split.pattern", "only a Regex pattern is supported");
        if ((*x).value("behavior", std::string()) != "Isolated") throw bad("pre_tokenizer.Split.behavior", "only \"Isolated\" is supported");
        if ((*x).value("invert", false)) throw bad("pre_tokenizer.Split.invert", "is not supported");
      } else if (ty == "ByteLevel") {
        byte_level = true;
        if ((*x).value("add_prefix_space", false)) throw bad("pre_tokenizer.ByteLevel.add_prefix_space", "is not supported");
        if ((*x).value("use_regex", true)) {
          if (!pattern.empty()) throw bad("pre_tokenizer", "Split followed by a regex ByteLevel is not supported");
          pattern = kGpt2SplitPattern;
        }
      } else {
        throw bad("pre_tokenizer", "type \"" + ty + "\" is not supported");
      }
    }
    if (!byte_level) throw bad("pre_tokenizer", "no ByteLevel step (only byte-level BPE is supported)");
    if (pattern.empty()) throw bad("pre_tokenizer", "no split pattern");
    t->splitter_ = std::make_unique<RegexSplitter>(pattern, where + ": pre_tokenizer");
  }

  // tokenizer_config.json: chat template and eos token.
  if (!config_text.empty()) {
    json c;
    try {
      c = json::parse(config_text);
    } catch (const json::exception& e) {
      throw Error(where + ": tokenizer_config.json is not valid JSON: " + e.what());
    }
    if (c.is_object()) {
      if (c.contains("chat_template") && c["chat_template"].is_string()) t->chat_template_ = c["chat_template"].get<std::string>();
      if (c.contains("eos_token") && c["eos_token"].is_string()) t->eos_token_ = c["eos_token"].get<std::string>();
      else if (c.contains("eos_token") && c["eos_token"].is_object() && c["eos_token"].contains("content") && c["eos_token"]["content"].is_string())
        t->eos_token_ = c["eos_token"]["content"].get<std::string>();
    }
  }
  return t;
}

void Tokenizer::encode_plain(std::string_view text, std::vector<int>& out) const {
  std::string normalized;
  if (nfc_ && !is_ascii(text)) {
    normalized = nfc(text);
    text = normalized;
  }
  WordCache& cache = thread_cache();
  splitter_->split(text, [&](std::string_view piece) {
    if (cache.get(piece, out)) return;
    const std::size_t at = out.size();
    if (!bpe_.encode(piece, out)) throw Error("tokenizer: a byte of the input has no single-byte token in the vocabulary");
    cache.put(piece, out.data() + at, out.size() - at);
  });
}

// One cache per (thread, tokenizer): encode() stays lock-free. Tokenizers are
// told apart by a serial number, never by address, so a new tokenizer can
// never see an old one's entries.
WordCache& Tokenizer::thread_cache() const {
  thread_local std::vector<std::pair<uint64_t, std::unique_ptr<WordCache>>> caches;
  for (auto& [serial, c] : caches)
    if (serial == serial_) return *c;
  if (caches.size() >= 8) caches.erase(caches.begin());  // bound what dead tokenizers leave behind
  caches.emplace_back(serial_, std::make_unique<WordCache>());
  return *caches.back().second;
}

void Tokenizer::clear_cache() const { thread_cache().clear(); }

std::vector<int> Tokenizer::encode(std::string_view input) const {
  std::string repaired;
  if (!utf8_is_valid(input)) {
    repaired = utf8_lossy(input);
    input = repaired;
  }
  std::vector<int> out;
  out.reserve(input.size() / 3 + 4);
  std::size_t start = 0;
  for (std::size_t i = 0; i < input.size();) {
    const auto& cands = added_by_byte_[static_cast<unsigned char>(input[i])];
    const Added* hit = nullptr;
    for (int c : cands) {
      const std::string& s = added_[c].content;
      if (input.compare(i, s.size(), s) == 0) {
        hit = &added_[c];
        break;
      }
    }
    if (!hit) {
      ++i;
      continue;
    }
    if (i > start) encode_plain(input.substr(start, i - start), out);
    out.push_back(hit->id);
    i += hit->content.size();
    start = i;
  }
  if (start < input.size()) encode_plain(input.substr(start), out);
  return out;
}

const std::string& Tokenizer::token_bytes(int id) const {
  if (id < 0 || id >= vocab_size()) throw Error("token id " + std::to_string(id) + " is outside the tokenizer's vocabulary [0, " + std::to_string(vocab_size()) + ")");
  return id_bytes_[id];
}

bool Tokenizer::is_special(int id) const { return id >= 0 && id < vocab_size() && special_[id]; }

std::string Tokenizer::decode(std::span<const int> ids, bool skip_special) const {
  std::string bytes;
  for (int id : ids)
    if (!(skip_special && is_special(id))) bytes += token_bytes(id);
  return utf8_lossy(bytes);
}

std::optional<int> Tokenizer::find(std::string_view content) const {
  for (const auto& a : added_)
    if (a.content == content) return a.id;
  const std::string key = byte_level_encode(content);
  auto it = std::lower_bound(vocab_sorted_.begin(), vocab_sorted_.end(), std::make_pair(key, -1));
  if (it != vocab_sorted_.end() && it->first == key) return it->second;
  return std::nullopt;
}

void check_tokenizer_matches(const Tokenizer& tok, const std::string& tokenizer_path, int model_vocab_size, const std::string& model_path) {
  if (tok.vocab_size() > model_vocab_size)
    throw Error("the tokenizer " + tokenizer_path + " does not match the model " + model_path + ": it has " + std::to_string(tok.vocab_size()) +
                " ids, the model's vocabulary " + std::to_string(model_vocab_size) + " (config.json vocab_size)");
}

}  // namespace coli
