// Whole-file and whole-stdin reads for the tools.
#pragma once
#include <cstddef>
#include <string>

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

}  // namespace coli
