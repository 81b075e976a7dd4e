// libFuzzer target: streaming detokenization of arbitrary id sequences.
// Every piece must be valid UTF-8 and the pieces must add up to decode().
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const auto tok = coli::Tokenizer::load("tests/data/qwen3-tokenizer");
  std::vector<int> ids;
  for (size_t i = 0; i + 3 <= size; i += 3) {
    const uint32_t v = data[i] | data[i + 1] << 8 | data[i + 2] << 16;
    // Bias toward the byte tokens (ids < 256), where characters get split.
    ids.push_back(static_cast<int>((v & 1 ? (v >> 1) % 256 : (v >> 1)) % tok->vocab_size()));
  }
  coli::Utf8Stream st;
  std::string all;
  for (int id : ids) {
    const std::string piece = st.push(tok->token_bytes(id));
    if (!coli::utf8_is_valid(piece)) std::abort();
    all += piece;
  }
  const std::string tail = st.flush();
  if (!coli::utf8_is_valid(tail)) std::abort();
  all += tail;
  if (all != tok->decode(ids)) std::abort();
  return 0;
}
