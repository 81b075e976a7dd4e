// coli::Error: the one exception type the libraries throw for bad input.
//
// Contract: what() is a single line that names the file, tensor, key or flag
// at fault. Tools print it and exit with status 1 (2 for command-line usage).
#pragma once
#include <stdexcept>
#include <string>

namespace coli {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& msg) : std::runtime_error(msg) {}
};

// Thrown for command-line misuse; tools exit with status 2.
class UsageError : public Error {
 public:
  explicit UsageError(const std::string& msg) : Error(msg) {}
};

}  // namespace coli
