#include "util/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "util/error.h"

namespace coli {

MappedFile::MappedFile(const std::string& path) {
  // O_NONBLOCK: a FIFO would otherwise block the open until a writer came;
  // it is refused below as any file that is not regular.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) throw Error(path + ": cannot open: " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int e = errno;
    ::close(fd);
    throw Error(path + ": cannot stat: " + std::strerror(e));
  }
  if (!S_ISREG(st.st_mode)) {  // mmap of a directory fails with a puzzling "No such device"
    ::close(fd);
    throw Error(path + (S_ISDIR(st.st_mode) ? ": is a directory, not a file" : ": is not a regular file"));
  }
  size_ = static_cast<std::size_t>(st.st_size);
  if (size_ > 0) {
    map_ = ::mmap(nullptr, size_, PROT_READ, MAP_SHARED, fd, 0);
    if (map_ == MAP_FAILED) {
      const int e = errno;
      map_ = nullptr;
      ::close(fd);
      throw Error(path + ": cannot mmap: " + std::strerror(e));
    }
  }
  ::close(fd);
}

MappedFile::~MappedFile() {
  if (map_) ::munmap(map_, size_);
}

}  // namespace coli
