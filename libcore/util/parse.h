// Small parsers for command-line values.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace coli {

// "7,8,9" -> {7, 8, 9}. Whitespace around items is allowed; empty items,
// non-numbers and negatives throw coli::UsageError naming `flag`.
std::vector<int> parse_id_list(const std::string& s, const std::string& flag);

// Like parse_id_list, for counts and sizes (llama-bench's "-p 128,512"):
// a bad item is "not a count from 0 to 2147483647".
std::vector<int> parse_int_list(const std::string& s, const std::string& flag);

// A seed from flag `flag`: decimal digits, 0 to 2^64-1. Anything else
// throws coli::UsageError naming the flag ("-1" above all: read as an
// unsigned number it silently became 2^64-1).
uint64_t parse_seed(const std::string& s, const std::string& flag);

// A worker-thread count from flag `flag`: 0 means all cores; negative counts
// and counts over 4x the hardware threads (far past any speed-up, and enough
// to exhaust the process table) throw coli::UsageError. Returns n.
int check_thread_count(int n, const std::string& flag);

// A byte size from flag `flag`: a number with an optional unit, binary as
// llama.cpp users know them: "8G", "8GiB", "12000M", "1.5g", "4096" (bytes).
// K, M, G, T (with or without "iB"/"B") are powers of 1024. Anything else,
// negative or overflowing, throws coli::UsageError naming the flag.
uint64_t parse_size(const std::string& s, const std::string& flag);

// --pcie-read's share (coli-run, coli-bench): "auto" (returns -1: the tool
// takes kPcieReadAutoShare when the experts come from a coli-pin mirror,
// else 0), "off" (0), or a number from 0 to 1. Anything else throws
// coli::UsageError naming the flag.
double parse_pcie_read(const std::string& s, const std::string& flag);
// What "auto" reads over PCIe with a mirror (with the default offset of 2):
// the best of the splits measured on the H200 machine, 8 and 40 layers at
// 1.75-16 GiB (docs/perf/hybrid.md).
constexpr double kPcieReadAutoShare = 0.35;
// The share a run takes from parse_pcie_read's value: a given share as is;
// auto (-1) kPcieReadAutoShare when its experts come from a mirror and no
// --decode-upload takes the misses, else 0.
double pcie_read_share(double parsed, bool mirror, bool decode_upload);
// --prefill-cpu: "auto" (-1), "off" (0) or a count of experts per layer
// from 0 to 65536; anything else throws coli::UsageError naming the flag.
int parse_prefill_cpu(const std::string& s, const std::string& flag);
// --pcie-read-offset (experts, 0 to 64); else coli::UsageError naming the flag.
double check_pcie_read_offset(double v, const std::string& flag);

}  // namespace coli
