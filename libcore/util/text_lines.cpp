#include "util/text_lines.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "util/error.h"
#include "util/io.h"
#include "util/publish.h"

namespace coli {

namespace {
bool is_space(char c) { return c == ' ' || c == '\t' || c == '\r'; }
}  // namespace

TextLines::TextLines(std::string_view text, const std::string& name) : text_(text), name_(name), empty_(text.empty()) {}

TextLines::TextLines(FromFile, const std::string& path) : name_(path), file_(std::make_unique<TextFileReader>(path)) { empty_ = file_->size() == 0; }

TextLines::~TextLines() = default;

bool TextLines::next_raw(std::string_view* line) {
  bool too_long = false;
  if (file_) {
    if (!file_->next(line, kTextLineMax, &too_long)) return false;
  } else {
    if (pos_ >= text_.size()) return false;
    const std::size_t end = std::min(text_.find('\n', pos_), text_.size());
    *line = text_.substr(pos_, end - pos_);
    pos_ = end + 1;
    too_long = line->size() > kTextLineMax;
  }
  ++line_no_;
  line_ = *line;
  if (too_long) fail("a line longer than " + std::to_string(kTextLineMax >> 20) + " MiB, which no file of this kind has");
  return true;
}

bool TextLines::next(std::vector<std::string_view>& words) {
  std::string_view line;
  while (next_raw(&line)) {
    words.clear();
    std::size_t i = 0;
    while (i < line.size()) {
      while (i < line.size() && is_space(line[i])) ++i;
      std::size_t j = i;
      while (j < line.size() && !is_space(line[j])) ++j;
      if (j > i) words.push_back(line.substr(i, j - i));
      i = j;
    }
    if (words.empty() || words[0][0] == '#') continue;
    return true;
  }
  return false;
}

void TextLines::fail(const std::string& what) const { throw Error(name_ + ":" + std::to_string(line_no_) + ": " + what); }

void TextLines::fail_eof(const std::string& what) const { throw Error(name_ + ": ends early: " + what); }

void TextLines::fail_eof_at_next_line(const std::string& what) const {
  throw Error(name_ + ":" + std::to_string(line_no_ + 1) + ": ends early: " + what);
}

uint64_t TextLines::number(std::string_view w, const char* what) const {
  if (w.empty() || w.size() > 20) fail(std::string(what) + " '" + std::string(w.substr(0, 24)) + "' is not a decimal number below 2^64");
  uint64_t v = 0;
  for (char c : w) {
    if (c < '0' || c > '9') fail(std::string(what) + " '" + std::string(w.substr(0, 24)) + "' is not a decimal number");
    const uint64_t d = c - '0';
    if (v > (UINT64_MAX - d) / 10) fail(std::string(what) + " '" + std::string(w) + "' is not below 2^64");
    v = v * 10 + d;
  }
  return v;
}

uint64_t TextLines::field(const char* key) {
  std::vector<std::string_view> w;
  if (!next(w)) fail_eof(std::string("no '") + key + "' line");
  if (w[0] != key || w.size() != 2) fail(std::string("expected '") + key + " N'");
  return number(w[1], key);
}

uint64_t TextLines::fingerprint(std::string_view w) const {
  if (w.size() != 16 || w.find_first_not_of("0123456789abcdef") != std::string_view::npos)
    fail("model fingerprint '" + std::string(w.substr(0, 24)) + "' is not 16 lowercase hex digits");
  uint64_t f = 0;
  for (char c : w) f = f << 4 | uint64_t(c <= '9' ? c - '0' : c - 'a' + 10);
  return f;
}

void write_text_file(const std::string& path, std::string_view text) {
  OutputFile out(path, /*overwrite=*/true);
  for (std::size_t done = 0; done < text.size();) {
    const ssize_t n = ::write(out.fd(), text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw Error(path + ": write failed: " + std::strerror(errno));
    done += std::size_t(n);
  }
  out.publish();
}

}  // namespace coli
