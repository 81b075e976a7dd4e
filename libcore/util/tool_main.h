// The one main() every coli tool has: run the tool, turn errors into one
// line on stderr and the exit status (2: usage, 1: bad input or failure),
// and fail when standard output could not be written.
#pragma once
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <iostream>

#include "util/error.h"

namespace coli {

// Standard output's fate once the tool is done: buffered output is written
// here, and an error now or in an earlier write (a full disk, `>/dev/full`,
// a closed descriptor) is one line and exit 1, not exit 0 with the output
// lost. Returns rc, or 1 (or rc when it already says failure) on an error.
inline int finish_stdout(const char* name, int rc) {
  std::cout.flush();
  errno = 0;
  const bool flushed = std::fflush(stdout) == 0;
  const int err = errno;
  if (flushed && !std::ferror(stdout) && !std::cout.bad()) return rc;
  if (!flushed && err != 0) std::fprintf(stderr, "%s: standard output: write error (%s)\n", name, std::strerror(err));
  else std::fprintf(stderr, "%s: standard output: write error\n", name);
  return rc != 0 ? rc : 1;
}

template <class Fn>
int tool_main(const char* name, Fn&& run) {
  int rc = 0;
  try {
    rc = run();
  } catch (const UsageError& e) {
    std::fprintf(stderr, "%s: %s (see --help)\n", name, e.what());
    return 2;
  } catch (const Error& e) {
    std::fprintf(stderr, "%s: %s\n", name, e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: error: %s\n", name, e.what());
    return 1;
  }
  return finish_stdout(name, rc);
}

}  // namespace coli
