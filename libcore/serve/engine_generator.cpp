#include "serve/engine_generator.h"

#include <algorithm>
#include <chrono>

#include "engine/chat_session.h"
#include "engine/generate.h"

namespace coli::serve {

EngineGenerator::EngineGenerator(Engine& engine, const Tokenizer& tok, int n_ctx)
    : engine_(engine), tok_(tok), style_(chat_style_of(tok.chat_template())), n_ctx_(n_ctx) {
  if (n_ctx_ < 2) throw Error("coli-serve: the context must hold at least 2 tokens");
}

std::vector<int> EngineGenerator::prompt_ids(const GenerationRequest& r) const {
  std::vector<int> ids;
  if (r.chat) {
    ChatOptions o;
    o.enable_thinking = r.enable_thinking;
    ids = tok_.encode(render_chat(r.messages, o, style_));
  } else {
    ids = tok_.encode(r.prompt);
  }
  if (ids.empty()) throw ApiError(400, "invalid_request_error", "the prompt is empty", r.chat ? "messages" : "prompt");
  if (static_cast<long>(ids.size()) + 1 > n_ctx_)
    throw ApiError(400, "invalid_request_error",
                   "the prompt has " + std::to_string(ids.size()) + " tokens; with one generated token that exceeds the context size of " +
                       std::to_string(n_ctx_) + " tokens",
                   r.chat ? "messages" : "prompt");
  return ids;
}

GenerationResult EngineGenerator::run(const GenerationRequest& r, const std::vector<int>& prompt,
                                      const std::function<bool(const std::string&)>& on_text) {
  GenerateOptions go;
  go.sampling = r.sampling;
  go.logprobs = false;
  go.n_ctx = n_ctx_;
  const int room = n_ctx_ - static_cast<int>(prompt.size());
  go.n_predict = r.max_tokens > 0 ? std::min(r.max_tokens, room) : room;
  go.stop_ids = tokenizer_stop_ids(tok_);
  StopStrings stops(r.stop);
  TextStreamer streamer(tok_);
  GenerationResult res;
  bool stop_string = false, eos = false;
  auto send = [&](const std::string& piece) {
    if (!piece.empty() && !res.cancelled && !on_text(piece)) res.cancelled = true;
  };
  go.keep_going = [&] { return !stop_string && !res.cancelled; };
  // Reuse the slot's session when the prompt extends what it holds.
  const bool reuse = !fed_.empty() && prompt.size() > fed_.size() && std::equal(fed_.begin(), fed_.end(), prompt.begin());
  if (!reuse) session_ = engine_.new_session(), fed_.clear();
  res.cached_tokens = static_cast<int>(fed_.size());
  const std::span<const int> feed(prompt.data() + fed_.size(), prompt.size() - fed_.size());
  const auto t0 = std::chrono::steady_clock::now();
  GenerateStats st;
  try {
    st = generate(engine_, session_, feed, go, [&](const TokenEvent& ev) {
      if (ev.is_stop) {
        eos = true;
        return;
      }
      const StopStrings::Out o = stops.push(streamer.push(ev.id));
      send(o.text);
      stop_string = o.stopped;
    });
  } catch (...) {
    fed_.clear();  // the session's state is undefined now
    throw;
  }
  fed_.insert(fed_.end(), st.fed.begin(), st.fed.end());
  if (!stop_string) send(stops.push(streamer.flush()).text + stops.flush());
  const double total_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  res.usage.prompt_tokens = static_cast<int>(prompt.size());
  res.usage.prompt_fed = st.n_prompt;
  res.usage.completion_tokens = st.n_generated;
  res.usage.prompt_ms = st.prefill_seconds * 1000.0;
  res.usage.predicted_ms = std::max(0.0, total_ms - res.usage.prompt_ms);
  if (!res.cancelled) res.finish_reason = stop_string || eos ? "stop" : "length";
  return res;
}

}  // namespace coli::serve
