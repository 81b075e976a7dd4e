// UTF-8 helpers for the tokenizer: lossy repair (each maximal ill-formed
// subsequence becomes one U+FFFD, as Unicode recommends and Rust's
// from_utf8_lossy does) and a streaming decoder that never emits a broken
// sequence: bytes of an incomplete trailing character are held back until
// the rest arrives (or flush() replaces them).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace coli {

// Length of the well-formed UTF-8 character at s[i..n), or 0 if the bytes
// there are ill-formed; *need_more is set when they are a valid but
// incomplete prefix cut by the end of the input.
std::size_t utf8_char_len(const unsigned char* s, std::size_t i, std::size_t n, bool* need_more = nullptr);

bool utf8_is_valid(std::string_view s);
// s with every ill-formed subsequence replaced by U+FFFD.
std::string utf8_lossy(std::string_view s);
// Appends code point cp as UTF-8.
void utf8_append(std::string& out, uint32_t cp);

class Utf8Stream {
 public:
  // Appends bytes; returns the text that is now complete and valid.
  std::string push(std::string_view bytes);
  // Returns what is held back, repaired (U+FFFD for a cut character).
  std::string flush();

 private:
  std::string pending_;
};

}  // namespace coli
