// The fuzz targets' input as the tools read it: written to a file of this
// process, then read back through util/io.h's bounded reader (regular
// files only, size-capped), so that the reader runs on every input too.
// The bytes must come back unchanged.
#pragma once
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "util/error.h"
#include "util/io.h"

namespace coli::fuzz {

// The input written to a file of this process (one per tag); its path.
inline std::string input_file(const uint8_t* data, std::size_t size, const char* tag) {
  const std::string path = "/tmp/coli-fuzz-" + std::string(tag) + "-" + std::to_string(::getpid());
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) std::abort();
  if (size && std::fwrite(data, 1, size, f) != size) std::abort();
  std::fclose(f);
  return path;
}

// The outcome of a parse: its error's text, or "" when it parsed.
template <typename F>
std::string error_of(F&& parse) {
  try {
    parse();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

inline std::string through_file(const uint8_t* data, std::size_t size, const char* tag) {
  const std::string path = input_file(data, size, tag);
  std::string text = read_text_file(path);
  if (text.size() != size || (size && std::memcmp(text.data(), data, size) != 0)) std::abort();
  return text;
}

}  // namespace coli::fuzz
