#include "tokenizer/utf8.h"

namespace coli {

namespace {
// Length of the sequence a lead byte starts (0: not a lead byte) and the
// allowed range of the byte after it (Unicode Table 3-7).
std::size_t lead(unsigned char c, unsigned char* lo, unsigned char* hi) {
  *lo = 0x80, *hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) return 2;
  if (c == 0xE0) return *lo = 0xA0, 3;
  if (c == 0xED) return *hi = 0x9F, 3;
  if (c >= 0xE1 && c <= 0xEF) return 3;
  if (c == 0xF0) return *lo = 0x90, 4;
  if (c == 0xF4) return *hi = 0x8F, 4;
  if (c >= 0xF1 && c <= 0xF3) return 4;
  return 0;
}
// How many bytes of the sequence at i are well-formed so far (>= 1 when the
// lead byte is valid), up to its full length or the end of the input.
std::size_t good_prefix(const unsigned char* s, std::size_t i, std::size_t n, std::size_t len, unsigned char lo, unsigned char hi) {
  std::size_t k = 1;
  for (; k < len && i + k < n; ++k) {
    const unsigned char b = s[i + k];
    if (k == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xBF)) break;
  }
  return k;
}
}  // namespace

std::size_t utf8_char_len(const unsigned char* s, std::size_t i, std::size_t n, bool* need_more) {
  if (need_more) *need_more = false;
  if (s[i] < 0x80) return 1;
  unsigned char lo, hi;
  const std::size_t len = lead(s[i], &lo, &hi);
  if (!len) return 0;
  const std::size_t k = good_prefix(s, i, n, len, lo, hi);
  if (k == len) return len;
  if (need_more && i + k >= n) *need_more = true;  // cut by the end, valid so far
  return 0;
}

// Bytes of the maximal subpart of an ill-formed sequence starting at i (>= 1).
static std::size_t ill_formed_len(const unsigned char* s, std::size_t i, std::size_t n) {
  unsigned char lo, hi;
  const std::size_t len = lead(s[i], &lo, &hi);
  return len ? good_prefix(s, i, n, len, lo, hi) : 1;
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
