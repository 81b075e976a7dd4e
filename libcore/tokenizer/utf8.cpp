#include "tokenizer/utf8.h"

namespace coli {

std::size_t utf8_char_len(const unsigned char* s, std::size_t i, std::size_t n, bool* need_more) {
  if (need_more) *need_more = false;
  const unsigned char c = s[i];
  if (c < 0x80) return 1;
  std::size_t len;
  unsigned char lo = 0x80, hi = 0xBF;  // range of the second byte
  if (c >= 0xC2 && c <= 0xDF) len = 2;
  else if (c == 0xE0) { len = 3; lo = 0xA0; }
  else if (c == 0xED) { len = 3; hi = 0x9F; }
  else if (c >= 0xE1 && c <= 0xEF) len = 3;
  else if (c == 0xF0) { len = 4; lo = 0x90; }
  else if (c == 0xF4) { len = 4; hi = 0x8F; }
  else if (c >= 0xF1 && c <= 0xF3) len = 4;
  else return 0;
  for (std::size_t k = 1; k < len; ++k) {
    if (i + k >= n) {
      if (need_more) *need_more = true;
      return 0;
    }
    const unsigned char b = s[i + k];
    if (k == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xBF)) return 0;
  }
  return len;
}

// Bytes of the maximal subpart of an ill-formed sequence starting at i (>= 1).
static std::size_t ill_formed_len(const unsigned char* s, std::size_t i, std::size_t n) {
  const unsigned char c = s[i];
  std::size_t len;
  unsigned char lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) len = 2;
  else if (c == 0xE0) { len = 3; lo = 0xA0; }
  else if (c == 0xED) { len = 3; hi = 0x9F; }
  else if (c >= 0xE1 && c <= 0xEF) len = 3;
  else if (c == 0xF0) { len = 4; lo = 0x90; }
  else if (c == 0xF4) { len = 4; hi = 0x8F; }
  else if (c >= 0xF1 && c <= 0xF3) len = 4;
  else return 1;
  std::size_t k = 1;
  for (; k < len && i + k < n; ++k) {
    const unsigned char b = s[i + k];
    if (k == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xBF)) break;
  }
  return k;
}

bool utf8_is_valid(std::string_view sv) {
  const auto* s = reinterpret_cast<const unsigned char*>(sv.data());
  for (std::size_t i = 0; i < sv.size();) {
    if (s[i] < 0x80) { ++i; continue; }
    const std::size_t l = utf8_char_len(s, i, sv.size());
    if (!l) return false;
    i += l;
  }
  return true;
}

static const char kReplacement[] = "\xEF\xBF\xBD";

std::string utf8_lossy(std::string_view sv) {
  if (utf8_is_valid(sv)) return std::string(sv);
  const auto* s = reinterpret_cast<const unsigned char*>(sv.data());
  std::string out;
  out.reserve(sv.size() + 8);
  for (std::size_t i = 0; i < sv.size();) {
    const std::size_t l = utf8_char_len(s, i, sv.size());
    if (l) {
      out.append(sv.data() + i, l);
      i += l;
    } else {
      out += kReplacement;
      i += ill_formed_len(s, i, sv.size());
    }
  }
  return out;
}

void utf8_append(std::string& out, uint32_t cp) {
  if (cp < 0x80) out += static_cast<char>(cp);
  else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | cp >> 6);
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | cp >> 12);
    out += static_cast<char>(0x80 | (cp >> 6 & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | cp >> 18);
    out += static_cast<char>(0x80 | (cp >> 12 & 0x3F));
    out += static_cast<char>(0x80 | (cp >> 6 & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

std::string Utf8Stream::push(std::string_view bytes) {
  pending_.append(bytes);
  const auto* s = reinterpret_cast<const unsigned char*>(pending_.data());
  const std::size_t n = pending_.size();
  std::string out;
  std::size_t i = 0;
  while (i < n) {
    bool more = false;
    const std::size_t l = utf8_char_len(s, i, n, &more);
    if (l) {
      out.append(pending_, i, l);
      i += l;
    } else if (more) {
      break;  // a character cut by the end: wait for its other bytes
    } else {
      out += kReplacement;
      i += ill_formed_len(s, i, n);
    }
  }
  pending_.erase(0, i);
  return out;
}

std::string Utf8Stream::flush() {
  std::string out = utf8_lossy(pending_);
  pending_.clear();
  return out;
}

}  // namespace coli
