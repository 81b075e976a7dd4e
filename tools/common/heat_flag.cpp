#include "common/heat_flag.h"

#include <cerrno>  // program_invocation_short_name: the tool, in its messages
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <vector>

#include "util/error.h"

namespace coli::cli {

HeatFlag HeatFlag::from(const boost::program_options::variables_map& vm, bool none_ok) {
  HeatFlag f;
  if (!vm.count("heat")) return f;
  f.given_ = true;
  f.value_ = vm["heat"].as<std::string>();
  if (!none_ok && (f.value_.empty() || f.value_ == "none")) throw UsageError("--heat needs a FILE");
  if (f.value_.empty()) throw UsageError("--heat needs a FILE or 'none'");
  return f;
}

std::string HeatFlag::path(uint64_t fingerprint) const {
  return heat_path_for(given_ ? value_ : "", fingerprint, std::getenv("XDG_CACHE_HOME"), std::getenv("HOME"));
}

Heat mirror_heat(const MirrorAttachment& mirror, const ModelSpec& spec) {
  const std::vector<uint64_t> counts = mirror.heat();
  uint64_t total = 0;
  for (uint64_t v : counts) total += v;
  Heat h(spec.num_layers, spec.num_experts);
  h.add_counts(counts);
  h.add_tokens(total / (uint64_t(spec.num_layers) * spec.num_experts_per_tok));
  return h;
}

namespace {

// The counters of the model's mirror: the run's, else a ready one attached
// for this (an error there is a line on stderr: the plan goes on without).
void add_mirror_heat(Heat& h, const Container& c, const ModelSpec& spec, const MirrorAttachment* mirror) {
  if (mirror) return h.merge(mirror_heat(*mirror, spec), 0);
  const std::string name = mirror_name(c.fingerprint());
  if (mirror_status(name).state != "ready") return;
  try {
    const MirrorAttachment m(name, c);
    h.merge(mirror_heat(m, spec), 0);
  } catch (const Error& e) {
    std::fprintf(stderr, "%s: the mirror's heat is not used: %s\n", program_invocation_short_name, e.what());
  }
}

}  // namespace

Heat planning_heat(const HeatFlag& flag, const Container& c, const ModelSpec& spec, const MirrorAttachment* mirror) {
  Heat h(spec.num_layers, spec.num_experts);
  if (flag.none()) return h;
  const std::string file = flag.path(c.fingerprint());
  std::error_code ec;
  if (!file.empty() && (flag.given() || std::filesystem::exists(file, ec))) h.merge(load_heat(file, c.fingerprint(), spec.num_layers, spec.num_experts), 0);
  if (!flag.given()) add_mirror_heat(h, c, spec, mirror);
  return h;
}

std::vector<uint64_t> tier_start_heat(const HeatRecorder& heat, const MirrorAttachment* mirror) {
  if (heat.on() && heat.previous().tokens() > 0) return {heat.previous().counts().begin(), heat.previous().counts().end()};
  if (mirror) return mirror->heat();  // what the runs on this mirror routed to
  return {};
}

}  // namespace coli::cli
