// Planner: from the budgets, the machine's measured rates and the routing
// heat, which experts live in VRAM, which in the locked RAM mirror and which
// stay on disk (the page cache), and what speed that plan predicts
// (coli-place, issue 19). Pure arithmetic: CPU-only tests reach all of it.
//
// The cost model, per generated token (decode), layer by layer:
//   p(l,e)  = heat(l,e) / tokens: the chance a token routes to e at layer l
//             (without heat: k / experts for every expert)
//   cpu(l)  = sum over e not in VRAM of p(l,e) * bytes / rate(tier(e))
//             rate: host_expert_gbs for ram, disk_gbs for disk
//   m(l)    = sum over e not in VRAM of p(l,e): the layer's expected misses
//   layer   = gpu_layer_s + max(k * gpu_expert_s, cpu(l)) + handoff_s * (1 - e^-m(l))
//   token   = sum over layers + token_fixed_s (embedding, lm_head, sampling)
// With the runs' PCIe reads (pcie_read_share s > 0, --pcie-read: the GPU
// reads round(s (M + o)) of a step's M misses over PCIe in place, at most
// the ones in RAM), over M ~ Binomial(k, m(l) / k) the split's expected
// pairs G for the GPU and H for the host, and P(H > 0), give
//   layer   = gpu_layer_s + max(k * gpu_expert_s + G * bytes / pcie_read_gbs,
//                               H * cpu(l) / m(l) + handoff_s * P(H > 0))
// with g = min(round(f M), round(s (M + o)), M), f the RAM tier's share of
// the layer's expected misses: the round trip runs while the GPU reads
// its share, so it counts on the host's side (measured on a skewed
// 40-layer model at 6-16 GiB: with the round trip outside the max the
// predictions were 8-22 % slow, this way 2-7 %, docs/perf/place.md). The
// picks below do not use this term.
// and per prompt chunk of T tokens (hybrid prefill, --prefill-upload):
//   up(l)   = bytes of layer l's experts outside VRAM / pcie_gbs (all of
//             them: a layer's upload runs a layer ahead of its routing)
//   compute = T * prefill_layer_token_s per layer
//   chunk   = up(0) + sum over l of max(compute, up(l + 1))
//
// plan_placement() fills VRAM first, then RAM, each greedily by the time an
// expert saves per byte (all experts of a model have one size, so: by the
// predicted token time it saves), recomputing its layer's makespan after
// every pick: an expert in a layer whose GPU part already bounds it saves
// nothing and is skipped for a hotter layer's. The picks charge the round
// trip to every layer with misses, not by 1 - e^-m: that would pull whole
// layers into VRAM under even routing, measured no faster than spreading
// them (docs/perf/place.md). Deterministic: ties go to
// the layer with the most CPU time left (even routing fills the layers
// evenly), then to the lower (layer, expert). Never over a budget: at most
// floor(vram_bytes / slot_bytes) experts in VRAM (the CUDA backend's slot
// count for the budget; with prefill uploads, less the staging areas'
// slots and their tables, or, when not even the staging fits, every slot
// without uploads, as the backend then runs) and
// floor(ram_bytes / expert_bytes) in RAM. When RAM holds every expert, the
// experts outside VRAM are all in RAM.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "placement/plan.h"

namespace coli {

// What the machine does, measured (coli-place probe) or given.
struct MachineRates {
  // Defaults: measured on the H200 machine (16 cores, PCIe 5) with the
  // int4-g32 real-shaped models (docs/perf/hybrid.md); a probe replaces the
  // host and PCIe rates, and a rates file may give all of them.
  double host_expert_gbs = 60;          // the CPU's expert kernels reading host RAM (GB/s, all threads)
  double disk_gbs = 2;                  // reading experts that are not in RAM (page cache misses)
  double pcie_gbs = 55;                 // pinned host -> device copies
  double gpu_layer_s = 43e-6;           // a decode step's GPU work per layer before its routed experts (serial with the CPU's)
  double gpu_expert_s = 1e-6;           // one routed expert for one token on the GPU (k of them: the layer's GPU expert part)
  double handoff_s = 39e-6;             // a layer with misses: the GPU -> CPU -> GPU round trip and the CPU threads' start
  double token_fixed_s = 140e-6;        // per token outside the layers (embedding, lm_head, sampling)
  double pcie_read_gbs = 44;            // the GPU's expert kernels reading registered host RAM over PCIe in place (--pcie-read)
  double prefill_layer_token_s = 2.5e-6;  // prompt processing per token and layer, every expert resident
};

struct PlannerInputs {
  uint64_t fingerprint = 0;
  int layers = 0, experts = 0, k = 0;   // k: experts per token
  uint64_t expert_bytes = 0;            // one routed expert (gate + up + down): what a miss reads
  // One expert slot on the device (gate, up and down each 256-byte padded,
  // VramLedger's ExpertSlot); 0: expert_bytes.
  uint64_t slot_bytes = 0;
  uint64_t vram_bytes = 0;              // VRAM for expert slots (after the trunk, KV cache, activations, the zero expert's slot)
  uint64_t ram_bytes = 0;               // RAM for the mirror's experts
  uint64_t vram_budget = 0, ram_budget = 0;  // the budgets as the user gave them (recorded in the plan)
  std::vector<uint64_t> heat;           // [layers * experts] routing counts, or empty
  uint64_t heat_tokens = 0;             // tokens the heat counted (0 with counts: taken as sum / (layers * k))
  MachineRates rates;
  std::vector<int> chunks = {512};  // prefill chunk sizes to pick from (vram_bytes must hold the largest one's activations)
  // >= 0: the runs upload prompt chunks' experts (--prefill-upload), whose
  // two staging areas hold the most experts a layer leaves out plus this
  // many (the swaps in flight), out of vram_bytes.
  int prefill_staging_extra = -1;
  // > 0: the staging is a ring of at least this many slots per area
  // (prefill_ring_size; the extra then counts for nothing): VramLedger::prefill_ring.
  int prefill_ring = 0;
  // Bytes the uploads' pointer tables take out of vram_bytes with them.
  uint64_t prefill_table_bytes = 0;
  // The runs' PCIe reads of RAM-tier misses in decode steps (--pcie-read
  // SHARE and --pcie-read-offset; 0: off, the model above).
  double pcie_read_share = 0, pcie_read_offset = 2;
};

struct Prediction {
  double hit_rate = 0;             // share of routed pairs served from VRAM
  double pcie_read_pairs = 0;      // share of routed pairs the GPU reads over PCIe (pcie_read_share > 0)
  double vram_bytes_per_token = 0, ram_bytes_per_token = 0, disk_bytes_per_token = 0;
  double decode_tok_s = 0;
  double prefill_tok_s = 0;        // at the chosen chunk size
  int prefill_chunk = 0;
  int gpu_bound_layers = 0, cpu_bound_layers = 0;  // which side bounds each layer
  std::string decode_bound;        // "gpu", "gpu (with its reads over PCIe)", "host RAM reads (CPU experts)" or "disk reads": what bounds decode
  std::string prefill_bound;       // "pcie" or "gpu"
};

// The plan (with its predictions as comments) for the inputs. Throws
// coli::Error for inputs out of range (no experts, zero rates, heat of the
// wrong size).
Plan plan_placement(const PlannerInputs& in, Prediction* predicted = nullptr);

// The cost model applied to any plan of the same shape (a plan read back,
// or another tool's placement such as llama.cpp's whole layers).
Prediction predict(const PlannerInputs& in, const Plan& plan);

}  // namespace coli
