// The one main() every coli tool has: run the tool, turn errors into one
// line on stderr and the exit status (2: usage, 1: bad input or failure).
#pragma once
#include <cstdio>
#include <exception>

#include "util/error.h"

namespace coli {

template <class Fn>
int tool_main(const char* name, Fn&& run) {
  try {
    return run();
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
}

}  // namespace coli
