// A tool run's model, its mirrored blobs served from a coli-pin segment
// when there is one (--mirror auto|off|NAME).
//
// auto: the segment named for the container's fingerprint, when it exists,
// is ready and matches (else the container alone, and `note` says why);
// off: the container alone; NAME: that segment, or an Error naming it.
// A checkpoint directory has no mirror (NAME is then an Error).
#pragma once
#include <memory>
#include <string>

#include "mirror/mirror.h"
#include "model/weights.h"

namespace coli {

struct LoadedModel {
  std::shared_ptr<MirrorAttachment> mirror;  // null: no mirror used
  std::unique_ptr<Model> model;              // keeps the mirror mapped while it lives
  std::string note;                          // auto without a mirror: why (for -v)
  // Something that is no segment where this model's mirror would be
  // (anyone can make /dev/shm/coli-FINGERPRINT a FIFO): the line a tool
  // says even without -v, since no coli-pin start can pin the model until
  // it is gone. Empty otherwise.
  std::string warning;
};

LoadedModel load_model(const std::string& path, const std::string& mirror);

// The checks of --mirror's value: auto, off, or a segment name.
void check_mirror_flag(const std::string& mirror);

}  // namespace coli
