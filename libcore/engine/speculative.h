// Speculative decoding with the checkpoint's own multi-token-prediction
// (MTP) layer: generate() with GenerateOptions::draft > 0.
//
// A round: the MTP layer drafts up to N tokens, each from the token before
// it and a hidden row (the main model's final-normed hidden at the
// position before, for the first draft; the MTP's own output for the
// chained ones: vLLM's scheme); the main model then verifies the pending
// token and the N drafts as one chunk of N + 1 tokens (each routed expert
// read once for all of them), and the longest prefix of drafts that the
// main model's own choices confirm is kept, plus the main model's token
// after it. The session is marked before the chunk and rewound to what was
// kept (Engine::mark / rewind: attention caches cut, Gated DeltaNet states
// replayed from the mark over the kept tokens), so it always holds exactly
// the tokens a draft-0 run would have fed.
//
// Greedy sampling (temperature 0): the tokens are those of draft 0 (up to
// the float rounding of an N+1-row chunk against one-row steps; bit for bit
// on the CPU reference). With temperature: the speculative sampling rule
// (accept draft d with probability min(1, p(d) / q(d)), else draw from the
// normalised max(0, p - q); after N accepted, draw from p), p and q the
// Sampler's filtered distributions of the main model and the MTP layer, so
// the output's distribution is the Sampler's.
//
// The MTP layer's own cache: positions [0, Session::mtp_past) hold MTP rows
// computed from the main model's hidden rows; the rows of the positions
// after it wait in Session::mtp_hidden / mtp_ids and run with the next
// first draft (one MTP pass of a few rows). A session whose history was fed
// without them (a draft-0 generation before, a reused prefix) cannot draft
// exactly; that generation runs without drafts (GenerateStats::draft_off).
#pragma once
#include "engine/generate.h"

namespace coli {

// generate() for opt.draft > 0 on an engine with an MTP module.
GenerateStats generate_speculative(Engine& engine, Session& session, std::span<const int> prompt, const GenerateOptions& opt,
                                   const std::function<void(const TokenEvent&)>& on_token);

}  // namespace coli
