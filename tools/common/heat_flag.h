// --heat FILE|none, the routing heat flag of coli-run, coli-bench,
// coli-place and coli-pin, resolved in this one place: what the flag names
// (a file, none, or the model's default file), and the heat a placement
// starts from (that file's, and a coli-pin mirror's counters).
//
// Contract:
//  - HeatFlag::from checks the value once, before any file is read: an
//    empty value is a coli::UsageError ("--heat needs a FILE or 'none'",
//    or "--heat needs a FILE" where none is refused).
//  - path() is where the model's heat is read from and merged into:
//    --heat FILE, else $XDG_CACHE_HOME/coli/heat-FINGERPRINT.txt (else
//    under $HOME/.cache); "" with none, or when neither variable is set.
//    The environment is read here, not in libcore (placement/heat.h).
//  - mirror_heat() is a mirror's counters as heat: the tokens are what the
//    counts imply (each token counts k experts in every layer).
//  - planning_heat() is the heat a plan is made from (coli-place plan and
//    explain, coli-run --plan auto): the file when --heat names one or the
//    default file exists, plus a ready mirror's counters when --heat is not
//    given; none (or no heat at all): zero counts, every expert even.
//  - tier_start_heat() is what a run's expert tier fills from without a
//    plan (coli-run under --vram-budget): the heat file's counts when it
//    counted any token, else the run's mirror's counters (--heat none
//    records nothing; it does not hide the mirror's), else none (even).
// The caller owns everything returned; nothing is cached.
#pragma once
#include <boost/program_options.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "formats/container.h"
#include "mirror/mirror.h"
#include "model/model_spec.h"
#include "placement/heat.h"
#include "placement/heat_recorder.h"

namespace coli::cli {

class HeatFlag {
 public:
  HeatFlag() = default;  // not given: the model's default file

  // vm's --heat. none_ok false (a tool that records into the file): 'none'
  // is refused as an empty value is.
  static HeatFlag from(const boost::program_options::variables_map& vm, bool none_ok = true);

  bool given() const { return given_; }  // --heat FILE or none
  bool none() const { return given_ && value_ == "none"; }
  std::string path(uint64_t fingerprint) const;

 private:
  bool given_ = false;
  std::string value_;
};

Heat mirror_heat(const MirrorAttachment& mirror, const ModelSpec& spec);

// mirror: the run's attached mirror, when it has one (else the model's
// ready mirror is attached here to read it).
Heat planning_heat(const HeatFlag& flag, const Container& c, const ModelSpec& spec, const MirrorAttachment* mirror = nullptr);

// heat: the run's recorder (HeatRecorder over HeatFlag::path); mirror: the
// run's, or null. Counts [layers * experts], or empty.
std::vector<uint64_t> tier_start_heat(const HeatRecorder& heat, const MirrorAttachment* mirror);

}  // namespace coli::cli
