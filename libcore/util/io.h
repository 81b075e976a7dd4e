// Whole-file and whole-stdin reads for the tools.
#pragma once
#include <string>

namespace coli {

// Throws coli::Error naming the file if it cannot be read.
std::string read_text_file(const std::string& path);
std::string read_stdin();

}  // namespace coli
