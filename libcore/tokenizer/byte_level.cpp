#include "tokenizer/byte_level.h"

#include <array>
#include <unordered_map>

#include "tokenizer/utf8.h"

namespace coli {

namespace {
struct Tables {
  std::array<uint32_t, 256> to_cp{};
  std::unordered_map<uint32_t, int> to_byte;
  Tables() {
    // Printable Latin-1 bytes stand for themselves; the others are shifted to 256+.
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool keep = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      to_cp[b] = keep ? b : 256 + n++;
      to_byte[to_cp[b]] = b;
    }
  }
};
const Tables& tables() {
  static const Tables t;
  return t;
}
}  // namespace

uint32_t byte_to_unicode(uint8_t b) { return tables().to_cp[b]; }

int unicode_to_byte(uint32_t cp) {
  auto it = tables().to_byte.find(cp);
  return it == tables().to_byte.end() ? -1 : it->second;
}

std::string byte_level_decode(std::string_view token) {
  std::string out;
  const auto* s = reinterpret_cast<const unsigned char*>(token.data());
  for (std::size_t i = 0; i < token.size();) {
    std::size_t l = utf8_char_len(s, i, token.size());
    if (!l) {  // not UTF-8: keep the byte
      out += token[i++];
      continue;
    }
    uint32_t cp = l == 1 ? s[i] : l == 2 ? (s[i] & 0x1F) << 6 | (s[i + 1] & 0x3F)
                 : l == 3 ? (s[i] & 0x0F) << 12 | (s[i + 1] & 0x3F) << 6 | (s[i + 2] & 0x3F)
                          : (s[i] & 0x07) << 18 | (s[i + 1] & 0x3F) << 12 | (s[i + 2] & 0x3F) << 6 | (s[i + 3] & 0x3F);
    const int b = unicode_to_byte(cp);
    if (b >= 0) out += static_cast<char>(b);
    else out.append(token.substr(i, l));
    i += l;
  }
  return out;
}

std::string byte_level_encode(std::string_view bytes) {
  std::string out;
  for (unsigned char b : bytes) utf8_append(out, byte_to_unicode(b));
  return out;
}

}  // namespace coli
