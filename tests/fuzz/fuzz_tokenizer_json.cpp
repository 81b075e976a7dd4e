// libFuzzer target: tokenizer.json loading on arbitrary text. Must load or
// throw coli::Error; a loaded tokenizer must encode and decode a probe.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"
#include "util/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    auto t = coli::Tokenizer::from_json(std::string_view(reinterpret_cast<const char*>(data), size), "", "fuzz.json");
    const auto ids = t->encode("Hello, world! 123 <|im_end|>");
    if (!coli::utf8_is_valid(t->decode(ids))) std::abort();
  } catch (const coli::Error&) {
  }
  return 0;
}
