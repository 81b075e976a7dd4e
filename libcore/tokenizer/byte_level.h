// GPT-2's byte-level alphabet: each of the 256 byte values is written as one
// printable Unicode character in vocabulary strings (space -> 'Ġ', newline
// -> 'Ċ', ...). Byte-level BPE vocabularies are spelled in it.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

namespace coli {

// The character (code point) that stands for byte b.
uint32_t byte_to_unicode(uint8_t b);
// The byte a code point stands for, or -1 if it is not in the alphabet.
int unicode_to_byte(uint32_t cp);
// Decodes a vocabulary string to raw bytes. Characters outside the alphabet
// are kept as their UTF-8 (what HF's ByteLevel decoder does).
std::string byte_level_decode(std::string_view token);
// Encodes raw bytes into the alphabet.
std::string byte_level_encode(std::string_view bytes);

}  // namespace coli
