// HeatRecorder: one tool run's routing heat file (--heat).
//
// At start it reads the file, when there is one, and checks that it is this
// model's heat (placement/heat.h load_heat), so a bad file stops the run
// before any work. The engine counts the run into run(). save() merges the
// run's counts into the file as it is then (read again, so a run that saved
// in the meantime is kept; runs saving at once take turns under an flock
// on PATH.lock, so none is lost), older counts decayed per heat.h, creates the
// file's directory and writes it atomically; the run's counts then start
// again from zero, so a second save adds only what came after the first.
#pragma once
#include <cstdint>
#include <string>

#include "model/model_spec.h"
#include "placement/heat.h"

namespace coli {

class HeatRecorder {
 public:
  // path "": off (run() is null, save() does nothing).
  HeatRecorder(std::string path, uint64_t fingerprint, const ModelSpec& spec);

  bool on() const { return !path_.empty(); }
  const std::string& path() const { return path_; }
  // The file's heat as read at start (zero counts when there was none):
  // what placement fills the tier from.
  const Heat& previous() const { return previous_; }
  // This run's counts, for Engine::set_heat; null when off.
  Heat* run() { return on() ? &run_ : nullptr; }
  // Call Engine::collect_heat() first. Throws coli::Error naming the file.
  void save();

 private:
  std::string path_;
  uint64_t fingerprint_;
  Heat previous_, run_;
};

}  // namespace coli
