// The fingerprint that names a model in records and heat files: a
// container's own (its manifest's), or for a checkpoint directory a hash of
// its config and tensors (convert/convert.h source_fingerprint, settings
// "checkpoint"), as coli-bench's model_fingerprint field has it.
#pragma once
#include <cstdint>
#include <string>

namespace coli {

// path: a container, a directory holding model.coli, or a checkpoint
// directory. Throws coli::Error naming what cannot be read.
uint64_t model_fingerprint(const std::string& path);

}  // namespace coli
