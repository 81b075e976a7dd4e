#include "bench/record_writer.h"

#include <cmath>
#include <cstring>

namespace coli {

using nlohmann::json;

bool parse_record_format(const std::string& s, RecordFormat* out) {
  if (s == "tsv") *out = RecordFormat::kTsv;
  else if (s == "csv") *out = RecordFormat::kCsv;
  else if (s == "jsonl" || s == "json") *out = RecordFormat::kJsonl;
  else if (s == "md") *out = RecordFormat::kMarkdown;
  else return false;
  return true;
}

const std::vector<std::string>& bench_fields() {
  static const std::vector<std::string> f = {
      // Same names and meanings as llama-bench's.
      "build_commit", "cpu_info", "gpu_info", "backends", "model_filename", "model_type", "model_size", "model_n_params", "n_batch",
      "n_ubatch", "n_threads", "n_prompt", "n_gen", "n_depth", "test_time", "avg_ns", "stddev_ns", "avg_ts", "stddev_ts", "samples_ns",
      "samples_ts",
      // coli's.
      "test", "repetitions", "model_fingerprint", "ttft_ms", "latency_p50_ms", "latency_p90_ms", "latency_p99_ms", "peak_ram_mb",
      "peak_vram_mb", "vram_budget_mb", "vram_budget_auto", "vram_free_mb", "vram_margin_mb", "tier_experts", "host_memory", "prefill_path", "plan_source", "tier_resident", "tier_hit_rate", "tier_pcie_read", "tier_pcie_pairs", "tier_split_pairs", "host_bytes_per_token", "bytes_read_per_token", "bytes_uploaded_per_token", "t_trunk_ms", "t_router_ms", "t_gpu_experts_ms",
      "t_cpu_experts_ms", "t_shared_ms", "t_combine_ms", "t_lm_head_ms", "t_upload_ms", "t_wait_ms",
      "gpu_wait_share", "cpu_expert_gbs", "pcie_bytes_per_token", "prompt_experts_resident", "prompt_experts_uploaded", "prompt_experts_cpu",
      "n_verify", "n_draft", "draft_accept_rate", "draft_tokens_per_step", "t_mtp_ms", "n_parallel", "error"};
  return f;
}

std::string RecordWriter::cell(const json& v) const {
  if (v.is_null()) return "";
  if (v.is_string()) return v.get<std::string>();
  if (v.is_number_integer() || v.is_number_unsigned()) return v.dump();
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (!std::isfinite(d)) return "";
    char b[32];
    std::snprintf(b, sizeof b, "%.6g", d);
    return b;
  }
  if (v.is_array()) {
    std::string s;
    for (const auto& x : v) s += (s.empty() ? "" : " ") + cell(x);
    return s;
  }
  return v.dump();
}

namespace {
std::string sanitize(std::string s, const char* bad) {
  for (char& c : s)
    if (std::strchr(bad, c)) c = ' ';
  return s;
}
std::string csv_quote(const std::string& s) {
  if (s.find_first_of(",\"\n\r") == std::string::npos) return s;
  std::string q = "\"";
  for (char c : s) q += c == '"' ? std::string("\"\"") : std::string(1, c);
  return q + "\"";
}
}  // namespace

void RecordWriter::write(const json& rec) {
  const auto& fields = bench_fields();
  std::string line;
  if (f_ == RecordFormat::kJsonl) {
    json o = json::object();
    nlohmann::ordered_json ordered;
    for (const auto& k : fields) ordered[k] = rec.contains(k) ? rec[k] : json();
    line = ordered.dump() + "\n";
  } else {
    const char* sep = f_ == RecordFormat::kCsv ? "," : f_ == RecordFormat::kTsv ? "\t" : " | ";
    auto row = [&](const std::vector<std::string>& cells) {
      std::string r = f_ == RecordFormat::kMarkdown ? "| " : "";
      for (std::size_t i = 0; i < cells.size(); ++i) r += (i ? sep : "") + cells[i];
      return r + (f_ == RecordFormat::kMarkdown ? " |\n" : "\n");
    };
    if (!header_done_) {
      line += row(fields);
      if (f_ == RecordFormat::kMarkdown) line += row(std::vector<std::string>(fields.size(), "---"));
      header_done_ = true;
    }
    std::vector<std::string> cells;
    for (const auto& k : fields) {
      std::string c = rec.contains(k) ? cell(rec[k]) : "";
      if (f_ == RecordFormat::kCsv) c = csv_quote(c);
      else c = sanitize(c, f_ == RecordFormat::kTsv ? "\t\n\r" : "|\n\r");
      cells.push_back(c);
    }
    line += row(cells);
  }
  std::fwrite(line.data(), 1, line.size(), out_);
  std::fflush(out_);
}

}  // namespace coli
