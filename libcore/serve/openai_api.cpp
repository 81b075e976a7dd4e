#include "serve/openai_api.h"

#include <cmath>
#include <limits>

namespace coli::serve {

using nlohmann::json;

namespace {

ApiError bad(const std::string& param, const std::string& why) {
  return ApiError(400, "invalid_request_error", param.empty() ? why : "'" + param + "' " + why, param);
}

json parse_body(const std::string& body) {
  json j;
  try {
    j = json::parse(body);
  } catch (const json::parse_error& e) {
    // The parser's message, without its "last read" echo of the body's bytes
    // (which may not be UTF-8, and would be quoted back to the client).
    std::string why = e.what();
    why = why.substr(0, why.find("; last read"));
    throw bad("", "the body is not valid JSON (byte " + std::to_string(e.byte) + "): " + why);
  } catch (const json::exception& e) {
    throw bad("", std::string("the body is not valid JSON: ") + e.what());
  }
  if (!j.is_object()) throw bad("", "the body must be a JSON object");
  return j;
}

// A field of j, or null when absent or null.
const json* field(const json& j, const char* key) {
  auto it = j.find(key);
  return it == j.end() || it->is_null() ? nullptr : &*it;
}

double number(const json& j, const char* key, double def, double lo, double hi) {
  const json* v = field(j, key);
  if (!v) return def;
  if (!v->is_number()) throw bad(key, "must be a number");
  const double x = v->get<double>();
  if (!std::isfinite(x) || x < lo || x > hi) throw bad(key, "must be in [" + json(lo).dump() + ", " + json(hi).dump() + "], not " + v->dump());
  return x;
}

int64_t integer(const json& j, const char* key, int64_t def, int64_t lo, int64_t hi) {
  const json* v = field(j, key);
  if (!v) return def;
  if (!v->is_number_integer()) throw bad(key, "must be an integer");
  if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
    throw bad(key, "must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  const int64_t x = v->get<int64_t>();
  if (x < lo || x > hi) throw bad(key, "must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], not " + v->dump());
  return x;
}

bool boolean(const json& j, const char* key, bool def) {
  const json* v = field(j, key);
  if (!v) return def;
  if (!v->is_boolean()) throw bad(key, "must be true or false");
  return v->get<bool>();
}

// The fields both endpoints share: model, stream, max_tokens, sampling, stop, n.
void common_fields(const json& j, const ApiLimits& limits, GenerationRequest& r) {
  if (const json* m = field(j, "model")) {
    if (!m->is_string()) throw bad("model", "must be a string");
    const std::string name = m->get<std::string>();
    if (!name.empty() && name != limits.model_name)
      throw ApiError(404, "invalid_request_error", "The model '" + name + "' does not exist (this server serves '" + limits.model_name + "')", "model");
  }
  r.stream = boolean(j, "stream", false);
  if (const json* so = field(j, "stream_options")) {
    if (!so->is_object()) throw bad("stream_options", "must be an object");
    r.include_usage = boolean(*so, "include_usage", false);
  }
  const int64_t big = std::numeric_limits<int>::max();
  int64_t mt = integer(j, "max_tokens", limits.max_tokens_default, 1, big);
  mt = integer(j, "max_completion_tokens", mt, 1, big);
  if (limits.max_tokens_limit > 0 && mt > limits.max_tokens_limit) mt = limits.max_tokens_limit;
  r.max_tokens = static_cast<int>(mt);
  SamplingParams& s = r.sampling;
  s.temperature = static_cast<float>(number(j, "temperature", 1.0, 0.0, 2.0));
  s.top_p = static_cast<float>(number(j, "top_p", 1.0, 0.0, 1.0));
  if (s.top_p == 0.0f) throw bad("top_p", "must be greater than 0");
  s.top_k = static_cast<int>(integer(j, "top_k", 0, 0, big));
  s.min_p = static_cast<float>(number(j, "min_p", 0.0, 0.0, 1.0));
  s.presence_penalty = static_cast<float>(number(j, "presence_penalty", 0.0, -2.0, 2.0));
  s.repeat_penalty = static_cast<float>(number(j, "repeat_penalty", 1.0, 1e-6, 100.0));
  s.penalty_last_n = 64;
  if (const json* seed = field(j, "seed")) {
    if (!seed->is_number_integer()) throw bad("seed", "must be an integer");
    r.seeded = true;
    s.seed = seed->is_number_unsigned() ? seed->get<uint64_t>() : static_cast<uint64_t>(seed->get<int64_t>());
  }
  if (integer(j, "n", 1, 1, 1) != 1) throw bad("n", "must be 1");
  if (const json* st = field(j, "stop")) {
    if (st->is_string()) {
      r.stop.push_back(st->get<std::string>());
    } else if (st->is_array()) {
      for (const json& x : *st) {
        if (!x.is_string()) throw bad("stop", "must be a string or a list of strings");
        r.stop.push_back(x.get<std::string>());
      }
    } else {
      throw bad("stop", "must be a string or a list of strings");
    }
    if (r.stop.size() > limits.max_stop) throw bad("stop", "may hold at most " + std::to_string(limits.max_stop) + " strings");
    for (const std::string& x : r.stop)
      if (x.empty()) throw bad("stop", "must not hold an empty string");
  }
}

std::string text_of_content(const json& c, std::size_t i) {
  const std::string where = "messages[" + std::to_string(i) + "].content";
  if (c.is_string()) return c.get<std::string>();
  if (!c.is_array()) throw bad(where, "must be a string or a list of text parts");
  std::string out;
  for (const json& part : c) {
    if (!part.is_object() || !part.contains("type") || part["type"] != "text" || !part.contains("text") || !part["text"].is_string())
      throw bad(where, "parts must be {\"type\": \"text\", \"text\": ...} (only text is supported)");
    out += part["text"].get<std::string>();
  }
  return out;
}

json choice_usage(const json& base, const Usage* usage) {
  json j = base;
  if (usage) j["usage"] = usage_json(*usage), j["timings"] = timings_json(*usage);
  return j;
}

}  // namespace

std::string error_body(const ApiError& e) {
  json err = {{"message", e.what()}, {"type", e.type()}, {"param", e.param().empty() ? json(nullptr) : json(e.param())}, {"code", e.status()}};
  return json{{"error", err}}.dump(-1, ' ', false, json::error_handler_t::replace);
}

GenerationRequest parse_chat_request(const std::string& body, const ApiLimits& limits) {
  const json j = parse_body(body);
  GenerationRequest r;
  r.chat = true;
  const json* msgs = field(j, "messages");
  if (!msgs) throw bad("messages", "is required");
  if (!msgs->is_array() || msgs->empty()) throw bad("messages", "must be a non-empty list");
  for (std::size_t i = 0; i < msgs->size(); ++i) {
    const json& m = (*msgs)[i];
    const std::string where = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) throw bad(where, "must be an object");
    if (!m.contains("role") || !m["role"].is_string()) throw bad(where + ".role", "must be a string");
    const std::string role = m["role"].get<std::string>();
    if (role != "system" && role != "user" && role != "assistant" && role != "tool" && role != "developer")
      throw bad(where + ".role", "must be system, developer, user, assistant or tool, not '" + role + "'");
    ChatMessage cm;
    cm.role = role == "developer" ? "system" : role;
    // OpenAI's rule: every message carries content, but an assistant turn
    // may leave it null (its tool calls said it; none are taken here).
    const bool has_content = m.contains("content") && !m["content"].is_null();
    if (!has_content && role != "assistant") throw bad(where + ".content", "is required");
    cm.content = has_content ? text_of_content(m["content"], i) : std::string();
    if (m.contains("reasoning_content") && m["reasoning_content"].is_string()) cm.reasoning_content = m["reasoning_content"].get<std::string>();
    r.messages.push_back(std::move(cm));
  }
  if (const json* kw = field(j, "chat_template_kwargs")) {
    if (!kw->is_object()) throw bad("chat_template_kwargs", "must be an object");
    if (kw->contains("enable_thinking")) {
      if (!(*kw)["enable_thinking"].is_boolean()) throw bad("chat_template_kwargs.enable_thinking", "must be true or false");
      r.enable_thinking = (*kw)["enable_thinking"].get<bool>();
    }
  }
  common_fields(j, limits, r);
  return r;
}

GenerationRequest parse_completion_request(const std::string& body, const ApiLimits& limits) {
  const json j = parse_body(body);
  GenerationRequest r;
  const json* p = field(j, "prompt");
  if (!p) throw bad("prompt", "is required");
  if (p->is_string()) r.prompt = p->get<std::string>();
  else if (p->is_array() && p->size() == 1 && (*p)[0].is_string()) r.prompt = (*p)[0].get<std::string>();
  else throw bad("prompt", "must be a string (or a list of one string)");
  common_fields(j, limits, r);
  return r;
}

std::string parse_tokenize_request(const std::string& body) {
  const json j = parse_body(body);
  const json* c = field(j, "content");
  if (!c || !c->is_string()) throw bad("content", "must be a string");
  return c->get<std::string>();
}

std::vector<int> parse_detokenize_request(const std::string& body, int vocab_size) {
  const json j = parse_body(body);
  const json* t = field(j, "tokens");
  if (!t || !t->is_array()) throw bad("tokens", "must be a list of token ids");
  std::vector<int> ids;
  for (const json& x : *t) {
    if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() >= vocab_size)
      throw bad("tokens", "must hold token ids in [0, " + std::to_string(vocab_size) + "), not " + x.dump());
    ids.push_back(static_cast<int>(x.get<int64_t>()));
  }
  return ids;
}

json usage_json(const Usage& u) {
  json j = {{"prompt_tokens", u.prompt_tokens}, {"completion_tokens", u.completion_tokens}, {"total_tokens", u.prompt_tokens + u.completion_tokens}};
  if (u.prompt_fed >= 0) j["prompt_tokens_details"] = {{"cached_tokens", u.prompt_tokens - u.prompt_fed}};
  return j;
}

// prompt_n: the prompt tokens computed (llama-server's: a reused prefix is not counted).
json timings_json(const Usage& u) {
  auto per_s = [](int n, double ms) { return ms > 0 ? n * 1000.0 / ms : 0.0; };
  const int fed = u.prompt_fed >= 0 ? u.prompt_fed : u.prompt_tokens;
  return {{"prompt_n", fed},     {"prompt_ms", u.prompt_ms},       {"prompt_per_second", per_s(fed, u.prompt_ms)},
          {"predicted_n", u.completion_tokens}, {"predicted_ms", u.predicted_ms}, {"predicted_per_second", per_s(u.completion_tokens, u.predicted_ms)}};
}

json chat_response(const std::string& id, int64_t created, const std::string& model, const std::string& text, const std::string& finish_reason,
                   const Usage& usage) {
  json choice = {{"index", 0}, {"message", {{"role", "assistant"}, {"content", text}}}, {"finish_reason", finish_reason}, {"logprobs", nullptr}};
  return {{"id", id},   {"object", "chat.completion"}, {"created", created}, {"model", model}, {"choices", json::array({choice})},
          {"usage", usage_json(usage)}, {"timings", timings_json(usage)}};
}

json completion_response(const std::string& id, int64_t created, const std::string& model, const std::string& text, const std::string& finish_reason,
                         const Usage& usage) {
  json choice = {{"index", 0}, {"text", text}, {"finish_reason", finish_reason}, {"logprobs", nullptr}};
  return {{"id", id},   {"object", "text_completion"}, {"created", created}, {"model", model}, {"choices", json::array({choice})},
          {"usage", usage_json(usage)}, {"timings", timings_json(usage)}};
}

json chat_chunk(const std::string& id, int64_t created, const std::string& model, const std::string& delta_text, bool first,
                const std::string& finish_reason, const Usage* usage) {
  json delta = json::object();
  if (first) delta["role"] = "assistant";
  if (finish_reason.empty()) delta["content"] = delta_text;
  json choice = {{"index", 0}, {"delta", delta}, {"finish_reason", finish_reason.empty() ? json(nullptr) : json(finish_reason)}, {"logprobs", nullptr}};
  return choice_usage({{"id", id}, {"object", "chat.completion.chunk"}, {"created", created}, {"model", model}, {"choices", json::array({choice})}},
                      usage);
}

json completion_chunk(const std::string& id, int64_t created, const std::string& model, const std::string& text, const std::string& finish_reason,
                      const Usage* usage) {
  json choice = {{"index", 0}, {"text", text}, {"finish_reason", finish_reason.empty() ? json(nullptr) : json(finish_reason)}, {"logprobs", nullptr}};
  return choice_usage({{"id", id}, {"object", "text_completion"}, {"created", created}, {"model", model}, {"choices", json::array({choice})}}, usage);
}

json usage_chunk(const std::string& id, int64_t created, const std::string& model, bool chat, const Usage& usage) {
  return {{"id", id},
          {"object", chat ? "chat.completion.chunk" : "text_completion"},
          {"created", created},
          {"model", model},
          {"choices", json::array()},
          {"usage", usage_json(usage)},
          {"timings", timings_json(usage)}};
}

// Invalid UTF-8 (a model's bytes) becomes U+FFFD rather than an exception.
std::string sse(const json& j) { return "data: " + j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n"; }
std::string sse_done() { return "data: [DONE]\n\n"; }

json models_list(const std::string& model, int64_t created) {
  return {{"object", "list"}, {"data", json::array({{{"id", model}, {"object", "model"}, {"created", created}, {"owned_by", "coli"}}})}};
}

}  // namespace coli::serve
