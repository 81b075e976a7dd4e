#include "util/io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <iostream>
#include <iterator>

#include "util/error.h"

namespace coli {

std::string read_text_file(const std::string& path, std::size_t max_bytes) {
  // O_NONBLOCK: opening a FIFO would otherwise wait for a writer.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) throw Error(path + ": cannot open: " + std::strerror(errno));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw Error(path + ": cannot stat: " + std::strerror(errno));
  if (S_ISDIR(st.st_mode)) throw Error(path + ": is a directory, not a file");
  if (!S_ISREG(st.st_mode)) throw Error(path + ": is not a regular file (a device, FIFO or socket)");
  if (uint64_t(st.st_size) > max_bytes)
    throw Error(path + ": " + std::to_string(st.st_size) + " bytes, more than the " + std::to_string(max_bytes >> 20) + " MiB this reads");
  std::string s(std::size_t(st.st_size), '\0');
  std::size_t at = 0;
  while (at < s.size()) {  // what the file held when it was opened (a file growing meanwhile is cut there)
    const ssize_t n = ::read(fd, s.data() + at, s.size() - at);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw Error(path + ": cannot read: " + std::strerror(errno));
    if (n == 0) break;
    at += std::size_t(n);
  }
  s.resize(at);
  return s;
}

std::string read_stdin() { return std::string(std::istreambuf_iterator<char>(std::cin), {}); }

}  // namespace coli
