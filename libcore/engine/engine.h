// Engine: the forward pass as a schedule of per-layer steps over a Backend.
//
// Per layer: trunk step (norm + attention or Gated DeltaNet + residual),
// post-attention norm, router, shared expert, routed experts, combine
// (x += shared + routed). Prompts are processed in chunks; decoding is the
// same path with one token. Feeding a prompt at once or token by token gives
// the same logits (up to float rounding).
#pragma once
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "engine/backend.h"
#include "model/model_spec.h"
#include "placement/heat.h"

namespace coli {

struct Session {
  std::unique_ptr<BackendState> state;
  int n_past = 0;  // tokens already in the state
  int mark = -1;   // n_past at Engine::mark (speculative verification); -1: none
  // The MTP layer's progress (engine/speculative.h): its cache holds
  // positions [0, mtp_past); the main model's hidden rows of positions
  // [mtp_past, n_past) wait in mtp_hidden, the ids fed at positions
  // mtp_past + 1 .. n_past - 1 in mtp_ids.
  int mtp_past = 0;
  std::vector<float> mtp_hidden;
  std::vector<int> mtp_ids;
};

// Time spent in each kind of step, accumulated while stats are enabled.
struct StageTimes {
  double embed = 0, trunk = 0, router = 0, shared = 0, experts = 0, combine = 0, lm_head = 0;  // seconds
  double device = 0;  // whole chunks run by a device backend (forward_chunk)
  double mtp = 0;     // the MTP layer (drafts), all its steps
  double total() const { return embed + trunk + router + shared + experts + combine + lm_head + device + mtp; }
};

// Called once per layer per chunk with the chunk's router choices:
// idx and w are [T, k], most probable first.
using RouteObserver = std::function<void(int layer, int T, const int* idx, const float* w)>;

class Engine {
 public:
  Engine(const ModelSpec& spec, Backend& backend, int prefill_chunk = 512);

  Session new_session() const;
  // Appends `tokens` to the session and returns the logits of the last one.
  // With hidden: also every token's final-normed hidden row, [tokens.size(),
  // hidden] (what the MTP layer reads; the per-layer path computes it).
  std::vector<float> forward(Session& s, std::span<const int> tokens, const RouteObserver& observe = {}, std::vector<float>* hidden = nullptr);
  // The same, returning the logits of every token: [tokens.size(), vocab].
  std::vector<float> forward_all(Session& s, std::span<const int> tokens, std::vector<float>* hidden = nullptr);

  // Multi-token prediction (engine/speculative.h drives these).
  bool has_mtp() const { return spec_.mtp_layers > 0; }
  // The MTP layer over T rows: row i reads token ids[i] and hidden row
  // h[i] (the main model's final-normed hidden at the position before the
  // token's, or the MTP's own output for a chained draft) at position
  // pos0 + i of the session's MTP cache, which it cuts at pos0 first.
  // Returns the logits of the last row, or of every row with all_logits;
  // with g also the MTP's output rows [T, hidden] after its norm (the
  // hidden a chained draft reads). The session's n_past is not changed.
  std::vector<float> mtp_forward(Session& s, std::span<const int> ids, const float* h, int pos0, bool all_logits, std::vector<float>* g = nullptr);
  // Verification: mark(s) before feeding drafted tokens; rewind(s, n) then
  // returns the session to n tokens (mark <= n <= n_past), exactly as if
  // only those had been fed (recurrent layers replayed, caches cut), and
  // ends the mark.
  void mark(Session& s);
  void rewind(Session& s, int n_past);
  // One decode step of several sessions at once (coli-serve's parallel
  // slots): ids[i] is appended to *sessions[i] (distinct sessions, each
  // with room for one more token); returns [S, vocab], row i what
  // forward(*sessions[i], {ids[i]}) alone gives (up to the backend's float
  // rounding of S-row against 1-row matmuls; bit for bit on the CPU
  // reference). The per-layer path runs the rows through every row-wise
  // step together (one pass over each weight; the routed experts over the
  // union of the rows' pairs, an expert two rows share read once) and steps
  // each row's own attention cache or recurrent state. A backend that runs
  // whole chunks takes the rows in one pass where it can (Backend::step_rows:
  // the CUDA backend's rows step), else runs them one after another.
  std::vector<float> forward_rows(std::span<Session* const> sessions, std::span<const int> ids);
  // The same into logits (resized to [S, vocab]): a caller that steps every
  // few milliseconds keeps one buffer, whose pages are touched once rather
  // than a fresh 16 MB (16 rows of 248,320) faulted in and zeroed each step.
  void forward_rows(std::span<Session* const> sessions, std::span<const int> ids, std::vector<float>& logits);
  // The same, read where the backend left them when it keeps its own host
  // copy (Backend::kept_logits: a GPU's pinned buffer, no 16 MB copy a
  // step; one session: its decode step's row), else in logits as above.
  // The span is valid until the next call into the engine or a change of
  // logits.
  std::span<const float> forward_rows_view(std::span<Session* const> sessions, std::span<const int> ids, std::vector<float>& logits);
  // The same step for rows that only need their greedy token (temperature
  // 0, no penalties): greedy[i] (resized to S) is the id of row i's largest
  // logit, ties to the lower id, found where the backend computed the
  // logits (Backend::greedy_only: no logits cross to the host); a code
  // below 0 marks a row that is not finite (check_greedy_id). Returns false,
  // nothing done, where the backend cannot (then forward_rows_view).
  bool forward_rows_greedy(std::span<Session* const> sessions, std::span<const int> ids, std::vector<int>& greedy);
  // Segments of several sessions in one pass (coli-serve's step: the
  // generating slots' decode rows and the prompt chunks of slots reading
  // theirs): segment i appends the lens[i] ids that follow the earlier
  // segments' in ids to *sessions[i] (distinct sessions, lens >= 1; at most
  // prefill_chunk() ids in all where a segment has more than one). Row i of the logits ([segments, vocab]) is
  // the last token's of segment i, what forward(*sessions[i], its ids)
  // alone gives up to the backend's rounding of many-row kernels. The
  // trunk's weights and the routed experts are read once for all the
  // tokens: a prompt chunk rides along with the decode rows instead of
  // reading every expert again in a pass of its own. One-token segments
  // first let a device step them as rows. The span as forward_rows_view's.
  std::span<const float> forward_segments_view(std::span<Session* const> sessions, std::span<const int> lens, std::span<const int> ids,
                                               std::vector<float>& logits);
  // The same for segments that only need their last token's greedy id
  // (forward_rows_greedy's contract); false, nothing done, where the
  // backend cannot.
  bool forward_segments_greedy(std::span<Session* const> sessions, std::span<const int> lens, std::span<const int> ids, std::vector<int>& greedy);
  // Most tokens one forward call takes at once (the engine's prompt chunk).
  int prefill_chunk() const { return prefill_chunk_; }

  const ModelSpec& spec() const { return spec_; }
  // Per-stage timing (adds a clock read around each backend call).
  void set_timing(bool on) { timing_ = on; }
  StageTimes& stage_times() { return times_; }

  // Routing heat: from now on every token forwarded (prompt chunks and
  // decode steps alike) is counted into heat, which must have the model's
  // layers x experts and outlive the engine's use of it; null stops. The
  // per-layer path counts the router's choices as it goes; a backend that
  // counts on its device (Backend::read_heat) keeps running whole chunks and
  // its counts arrive at collect_heat(), which the owner of the heat calls
  // before reading it. set_heat first collects into the heat it replaces;
  // counts the device made while no heat was set are dropped.
  void set_heat(Heat* heat);
  void collect_heat();

 private:
  // forward_rows and forward_rows_view: the backend's kept rows (view and
  // a backend that keeps them), else null with the rows in logits.
  const float* rows_step(std::span<Session* const> sessions, std::span<const int> ids, std::vector<float>& logits, bool view);
  // The ids and sessions of a rows step checked (count, vocabulary, distinct).
  void check_rows(std::span<Session* const> sessions, std::span<const int> ids) const;
  // forward_rows_greedy's and forward_segments_greedy's step, checked:
  // session i takes lens[i] of ids (all 1: a rows step).
  bool greedy_step(std::span<Session* const> sessions, std::span<const int> lens, std::span<const int> ids, std::vector<int>& greedy);
  // The same for segments; returns their ids in all.
  int check_segments(std::span<Session* const> sessions, std::span<const int> lens, std::span<const int> ids) const;
  enum class Logits { kNone, kLast, kAll };
  // Checks the ids, then runs them chunk by chunk; last-token or all
  // logits, and every token's hidden row appended to hidden when given.
  std::vector<float> run(Session& s, std::span<const int> tokens, bool all_logits, const RouteObserver& observe, std::vector<float>* hidden);
  // One chunk; returns the logits it was asked for.
  std::vector<float> forward_chunk(Session& s, const int* ids, int T, Logits want, const RouteObserver& observe, std::vector<float>* hidden);
  // The per-layer path over T rows: the embedding, then per layer
  // trunk(l, x) (one sequence's chunk, or one row of each of T sessions)
  // and the MoE block; the last logit_rows rows' logits into logits, and
  // with hidden every row's final-normed hidden appended to it.
  using TrunkStep = std::function<void(int layer, float* x)>;
  void run_layers(const int* ids, int T, const TrunkStep& trunk, const RouteObserver& observe, int logit_rows, float* logits,
                  std::vector<float>* hidden = nullptr);
  // Layer l's trunk step and MoE block over x[T, hidden], with arrays
  // allocated once per pass.
  struct Scratch;
  void run_layer(int l, int T, float* x, const TrunkStep& trunk, const RouteObserver& observe, Scratch& scratch);
  void check_ids(std::span<const int> ids) const;
  // fn(), its time charged to a stage when timing is on.
  template <class F>
  void timed(double StageTimes::*stage, F&& fn);

  const ModelSpec& spec_;
  Backend& backend_;
  int prefill_chunk_;
  bool timing_ = false;
  Heat* heat_ = nullptr;
  bool device_heat_ = false;  // the backend counts whole chunks itself
  std::vector<uint64_t> heat_buf_;
  StageTimes times_;
};

}  // namespace coli
