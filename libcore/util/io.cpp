#include "util/io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <iostream>
#include <iterator>

#include "util/error.h"

namespace coli {

namespace {

// The checks every text read makes before a byte is read: a regular file
// (O_NONBLOCK: opening a FIFO would otherwise wait for a writer) of at
// most max_bytes. Returns the open descriptor; *size its size.
int open_text_file(const std::string& path, std::size_t max_bytes, uint64_t* size) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) throw Error(path + ": cannot open: " + std::strerror(errno));
  struct stat st {};
  const int rc = ::fstat(fd, &st);
  const int err = errno;
  auto refuse = [&](const std::string& why) {
    ::close(fd);
    throw Error(path + ": " + why);
  };
  if (rc != 0) refuse(std::string("cannot stat: ") + std::strerror(err));
  if (S_ISDIR(st.st_mode)) refuse("is a directory, not a file");
  if (!S_ISREG(st.st_mode)) refuse("is not a regular file (a device, FIFO or socket)");
  if (uint64_t(st.st_size) > max_bytes) refuse(std::to_string(st.st_size) + " bytes, more than the " + std::to_string(max_bytes >> 20) + " MiB this reads");
  *size = uint64_t(st.st_size);
  return fd;
}

// Up to n bytes into p; 0 at the end of the file.
std::size_t read_some(int fd, char* p, std::size_t n, const std::string& path) {
  for (;;) {
    const ssize_t got = ::read(fd, p, n);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) throw Error(path + ": cannot read: " + std::strerror(errno));
    return std::size_t(got);
  }
}

}  // namespace

std::string read_text_file(const std::string& path, std::size_t max_bytes) {
  uint64_t size = 0;
  const int fd = open_text_file(path, max_bytes, &size);
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  std::string s(std::size_t(size), '\0');
  std::size_t at = 0;
  while (at < s.size()) {  // what the file held when it was opened (a file growing meanwhile is cut there)
    const std::size_t n = read_some(fd, s.data() + at, s.size() - at, path);
    if (n == 0) break;
    at += n;
  }
  s.resize(at);
  return s;
}

TextFileReader::TextFileReader(const std::string& path, std::size_t max_bytes) : path_(path) { fd_ = open_text_file(path, max_bytes, &size_); }

TextFileReader::~TextFileReader() {
  if (fd_ >= 0) ::close(fd_);
}

void TextFileReader::fill() {
  constexpr std::size_t kBlock = std::size_t(64) << 10;
  if (pos_ > 0) {  // keep only the unread part
    std::memmove(buf_.data(), buf_.data() + pos_, end_ - pos_);
    end_ -= pos_, pos_ = 0;
  }
  const uint64_t left = size_ - read_;
  const std::size_t want = std::size_t(std::min<uint64_t>(kBlock, left));
  if (want == 0) {
    eof_ = true;
    return;
  }
  if (buf_.size() < end_ + want) buf_.resize(end_ + want);
  const std::size_t n = read_some(fd_, buf_.data() + end_, want, path_);
  if (n == 0) eof_ = true;  // the file shrank
  end_ += n, read_ += n;
}

bool TextFileReader::next(std::string_view* line, std::size_t max_line, bool* too_long) {
  *too_long = false;
  for (;;) {
    const char* b = buf_.data() + pos_;
    const std::size_t have = end_ - pos_;
    if (const void* nl = have ? std::memchr(b, '\n', have) : nullptr) {
      const std::size_t n = std::size_t(static_cast<const char*>(nl) - b);
      *line = std::string_view(b, std::min(n, max_line));
      *too_long = n > max_line;
      pos_ += n + 1;
      return true;
    }
    if (have > max_line) {  // no need to read the rest of it
      *line = std::string_view(b, max_line);
      *too_long = true;
      pos_ = end_;
      return true;
    }
    if (eof_) {
      if (have == 0) return false;
      *line = std::string_view(b, have);
      pos_ = end_;
      return true;
    }
    fill();
  }
}

std::string read_stdin() { return std::string(std::istreambuf_iterator<char>(std::cin), {}); }

}  // namespace coli
