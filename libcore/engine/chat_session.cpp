#include "engine/chat_session.h"

#include <algorithm>

namespace coli {

std::vector<int> tokenizer_stop_ids(const Tokenizer& tok) {
  std::vector<int> ids;
  for (const std::string& s : {tok.eos_token(), std::string("<|im_end|>"), std::string("<|endoftext|>")}) {
    if (s.empty()) continue;
    if (auto id = tok.find(s); id && std::find(ids.begin(), ids.end(), *id) == ids.end()) ids.push_back(*id);
  }
  return ids;
}

ChatSession::ChatSession(Engine& engine, const Tokenizer& tok, GenerateOptions gen, ChatOptions chat)
    : engine_(engine), tok_(tok), gen_(std::move(gen)), chat_(chat), style_(chat_style_of(tok.chat_template())), session_(engine.new_session()) {
  for (int id : tokenizer_stop_ids(tok)) gen_.stop_ids.push_back(id);
}

GenerateStats ChatSession::respond(const std::function<void(const std::string&)>& on_text) {
  ChatOptions opt = chat_;
  opt.add_generation_prompt = true;
  const std::vector<int> ids = tok_.encode(render_chat(messages_, opt, style_));
  // Reuse the state when the new prompt extends what it has seen.
  std::span<const int> todo(ids);
  if (!fed_.empty() && fed_.size() < ids.size() && std::equal(fed_.begin(), fed_.end(), ids.begin())) {
    todo = todo.subspan(fed_.size());
  } else {
    session_ = engine_.new_session();
    fed_.clear();
  }
  TextStreamer streamer(tok_);
  std::vector<int> reply;
  GenerateStats st = generate(engine_, session_, todo, gen_, [&](const TokenEvent& ev) {
    if (ev.is_stop) return;
    if (ev.id < tok_.vocab_size()) reply.push_back(ev.id);
    const std::string piece = streamer.push(ev.id);
    if (!piece.empty()) on_text(piece);
  });
  const std::string tail = streamer.flush();
  if (!tail.empty()) on_text(tail);
  fed_.insert(fed_.end(), st.fed.begin(), st.fed.end());
  messages_.push_back({"assistant", tok_.decode(reply, /*skip_special=*/true), {}});
  return st;
}

}  // namespace coli
