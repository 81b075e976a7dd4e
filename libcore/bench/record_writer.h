// RecordWriter: benchmark records as a stream a shell pipeline can consume.
//
// Every record has the same fields in the same order (kBenchFields, the
// documented schema); each is written and flushed as soon as it is complete.
//   tsv    header line, then one tab-separated line per record (default)
//   csv    the same, comma-separated, RFC 4180 quoting
//   jsonl  one JSON object per line
//   md     a Markdown table, header first
// Missing values are empty (tsv, csv, md) or null (jsonl); lists are
// space-separated (tsv, csv, md) or JSON arrays (jsonl).
#pragma once
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace coli {

enum class RecordFormat { kTsv, kCsv, kJsonl, kMarkdown };
bool parse_record_format(const std::string& s, RecordFormat* out);

// The schema: field names in output order.
const std::vector<std::string>& bench_fields();

class RecordWriter {
 public:
  RecordWriter(RecordFormat f, std::FILE* out) : f_(f), out_(out) {}
  // rec: an object with any subset of bench_fields() (others are ignored).
  void write(const nlohmann::json& rec);

 private:
  std::string cell(const nlohmann::json& v) const;
  RecordFormat f_;
  std::FILE* out_;
  bool header_done_ = false;
};

}  // namespace coli
