// libFuzzer target: encoding arbitrary bytes with the real Qwen3 tokenizer
// (run from the repository root). Output ids must be in range, decode to
// valid UTF-8, and ASCII input must round-trip exactly.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>

#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const auto tok = coli::Tokenizer::load("tests/data/qwen3-tokenizer");
  const std::string in(reinterpret_cast<const char*>(data), size);
  const auto ids = tok->encode(in);
  for (int id : ids)
    if (id < 0 || id >= tok->vocab_size()) std::abort();
  const std::string out = tok->decode(ids);
  if (!coli::utf8_is_valid(out)) std::abort();
  bool ascii = true;
  for (unsigned char c : in) ascii &= c < 0x80;
  if (ascii && out != in) std::abort();
  return 0;
}
