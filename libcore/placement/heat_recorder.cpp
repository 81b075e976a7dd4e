#include "placement/heat_recorder.h"

#include <filesystem>
#include <system_error>

#include "util/error.h"

namespace coli {

namespace fs = std::filesystem;

HeatRecorder::HeatRecorder(std::string path, uint64_t fingerprint, const ModelSpec& spec)
    : path_(std::move(path)), fingerprint_(fingerprint), previous_(spec.num_layers, spec.num_experts), run_(previous_) {
  std::error_code ec;
  if (on() && fs::exists(path_, ec)) previous_ = load_heat(path_, fingerprint_, spec.num_layers, spec.num_experts);
}

void HeatRecorder::save() {
  if (!on()) return;
  std::error_code ec;
  Heat merged(run_.layers(), run_.experts());
  if (fs::exists(path_, ec)) merged = load_heat(path_, fingerprint_, run_.layers(), run_.experts());
  merged.merge(run_);
  const fs::path dir = fs::path(path_).parent_path();
  if (!dir.empty() && !fs::exists(dir, ec) && !fs::create_directories(dir, ec) && ec)
    throw Error(dir.string() + ": cannot create the heat file's directory: " + ec.message());
  save_heat(path_, merged, fingerprint_);
  run_ = Heat(run_.layers(), run_.experts());
}

}  // namespace coli
