// The line reader of coli's small text files (heat, plan), and their atomic
// write. One place for the rules they share: '#' comments and blank lines
// skipped, words split on spaces and tabs (CR ignored), decimal numbers
// below 2^64, 16-hex-digit fingerprints (written by formats/container.h
// hex64), and errors as "NAME:LINE: what". A text in memory, or a file
// read as it is parsed (util/io.h TextFileReader: regular files only, at
// most kTextFileMax), so that a parser stops at the first bad line; lines
// are at most kTextLineMax bytes either way.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace coli {

class TextFileReader;

class TextLines {
 public:
  // name: what errors call the text (a file's path). Both must outlive this.
  TextLines(std::string_view text, const std::string& name);
  // The file at path (also the errors' name, which must outlive this),
  // read as lines are asked for. Throws coli::Error as read_text_file.
  struct FromFile {};
  TextLines(FromFile, const std::string& path);
  ~TextLines();
  // The next line as it is, without its '\n' (valid until the next call);
  // false at the end. A line longer than kTextLineMax: fail().
  bool next_raw(std::string_view* line);
  // The words of the next line that is neither blank nor a comment; false
  // at the end of the text.
  bool next(std::vector<std::string_view>& words);
  // The line next() or next_raw() read last, as it is.
  std::string_view raw_line() const { return line_; }
  // The text has no byte at all.
  bool empty() const { return empty_; }
  int line_no() const { return line_no_; }
  // coli::Error "NAME:LINE: what" for the line last read.
  [[noreturn]] void fail(const std::string& what) const;
  // At the end of the text: "NAME: ends early: what".
  [[noreturn]] void fail_eof(const std::string& what) const;
  // At the end of the text, naming the missing line (the one after the
  // last): "NAME:LINE: ends early: what".
  [[noreturn]] void fail_eof_at_next_line(const std::string& what) const;
  // Decimal digits only, at most UINT64_MAX; else fail() naming `what`.
  uint64_t number(std::string_view w, const char* what) const;
  // The next line must be "KEY N": returns N.
  uint64_t field(const char* key);
  // 16 lowercase hex digits (a model fingerprint); else fail().
  uint64_t fingerprint(std::string_view w) const;

 private:
  std::string_view text_;
  const std::string& name_;
  std::unique_ptr<TextFileReader> file_;  // FromFile: the text is read from it
  std::size_t pos_ = 0;
  int line_no_ = 0;
  std::string_view line_;
  bool empty_ = false;
};

// Writes text to path atomically (util/publish.h OutputFile: readers see
// the old file or the new one), replacing a regular file there. Errors name
// the path.
void write_text_file(const std::string& path, std::string_view text);

}  // namespace coli
