// What a run without a GPU tier does with a plan (coli-place): its RAM
// part. The experts a plan puts in VRAM or RAM are asked into memory ahead
// of use (madvise WILLNEED on their pages: the kernel reads them in the
// background while the run starts); the ones it leaves on disk are read on
// first use, as before. Only speed changes: the weights are the same bytes.
#pragma once
#include <cstdint>

#include "model/weights.h"
#include "placement/plan.h"

namespace coli {

// Returns the bytes advised. The plan must be of this model's shape (an
// Error otherwise).
uint64_t advise_plan_ram(const Model& model, const Plan& plan);

}  // namespace coli
