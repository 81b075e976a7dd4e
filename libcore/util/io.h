// Whole-file and whole-stdin reads for the tools.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace coli {

// The most read_text_file() takes by default: far above any text file the
// tools read (heat, plan and rates files, prompts, chat messages,
// config.json, tokenizer.json), far below what would exhaust memory.
inline constexpr std::size_t kTextFileMax = std::size_t(256) << 20;

// The bytes of a regular file of at most max_bytes. Anything else is a
// coli::Error naming the file, before a byte is read: a directory, a
// FIFO (opened without blocking), a device such as /dev/zero, /dev/full
// or /dev/null, a larger file, or one that cannot be opened or read.
std::string read_text_file(const std::string& path, std::size_t max_bytes = kTextFileMax);
std::string read_stdin();

// The longest line of the line-based files (heat, plan and rates files):
// their longest lines (a heat file's layer of 512 counts) are tens of KiB.
inline constexpr std::size_t kTextLineMax = std::size_t(1) << 20;

// A regular file of at most max_bytes read a line at a time, as a parser
// consumes it, so that it fails at the first bad line without reading the
// rest: the checks of read_text_file before a byte is read (same errors),
// and at most one line (max_line bytes, and a 64 KiB block) held at once.
// Not copyable; the file is closed with the object.
class TextFileReader {
 public:
  explicit TextFileReader(const std::string& path, std::size_t max_bytes = kTextFileMax);
  ~TextFileReader();
  TextFileReader(const TextFileReader&) = delete;
  TextFileReader& operator=(const TextFileReader&) = delete;
  // The next line without its '\n' (valid until the next call); false at
  // the end (a last line without '\n' is a line). A line of more than
  // max_line bytes: *too_long, and *line holds its first max_line bytes.
  bool next(std::string_view* line, std::size_t max_line, bool* too_long);
  // The file's size when it was opened (what is read; a file growing
  // meanwhile is cut there).
  uint64_t size() const { return size_; }

 private:
  void fill();
  std::string path_;
  int fd_ = -1;
  uint64_t size_ = 0, read_ = 0;
  std::string buf_;
  std::size_t pos_ = 0, end_ = 0;
  bool eof_ = false;
};

}  // namespace coli
