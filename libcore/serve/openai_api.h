// The OpenAI-compatible HTTP API's requests and responses (coli-serve, issue
// 32), as plain functions over JSON text: what a request body asks for,
// checked field by field, and the bodies and server-sent-event chunks sent
// back, in the shapes of OpenAI's chat.completion / chat.completion.chunk /
// text_completion objects plus llama-server's `timings` (so clients written
// for either read them). No sockets here: the transport calls these.
//
// A malformed body, a field of the wrong type or out of range, an unknown
// model name: ApiError with the HTTP status, OpenAI's error type and the
// offending field (`param`), which error_body() turns into OpenAI's
// {"error": {...}} shape. Nothing here throws anything else for any input
// (tests/fuzz/fuzz_serve_request.cpp).
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "sampling/sampler.h"
#include "tokenizer/chat.h"
#include "util/error.h"

namespace coli::serve {

// An error a request earns: status 400 (invalid_request_error), 401
// (authentication_error), 404 (model not found), 413 (body too large), 503
// (server busy). param: the request field at fault, or empty.
class ApiError : public Error {
 public:
  ApiError(int status, std::string type, const std::string& message, std::string param = {})
      : Error(message), status_(status), type_(std::move(type)), param_(std::move(param)) {}
  int status() const { return status_; }
  const std::string& type() const { return type_; }
  const std::string& param() const { return param_; }

 private:
  int status_;
  std::string type_, param_;
};

// {"error": {"message", "type", "param", "code"}} of e.
std::string error_body(const ApiError& e);

// What a server accepts (its flags).
struct ApiLimits {
  std::string model_name;      // the name /v1/models lists; requests may name it or leave "model" out
  int max_tokens_default = 0;  // max_tokens when a request gives none (0: until the context is full)
  int max_tokens_limit = 0;    // larger requests are cut to it (0: no limit but the context)
  std::size_t max_stop = 4;    // OpenAI's limit on stop strings
};

// A generation request of /v1/chat/completions (messages) or
// /v1/completions (prompt), with OpenAI's defaults where a field is absent
// (temperature 1, top_p 1; top_k 0 and min_p 0: off, as OpenAI has neither).
struct GenerationRequest {
  bool chat = false;
  std::vector<ChatMessage> messages;  // chat
  std::optional<bool> enable_thinking;  // chat_template_kwargs.enable_thinking (as vLLM / llama-server take it)
  std::string prompt;                 // completion (a string; token-id prompts are not taken)
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage: a last chunk with usage and no choices
  int max_tokens = 0;          // 0: until the context is full or a stop
  SamplingParams sampling;
  bool seeded = false;  // a "seed" was given (else the server draws one)
  std::vector<std::string> stop;
};

// Parse and check a body; throws ApiError (400, or 404 for another model).
GenerationRequest parse_chat_request(const std::string& body, const ApiLimits& limits);
GenerationRequest parse_completion_request(const std::string& body, const ApiLimits& limits);

// POST /tokenize {"content": text, "add_special"?: bool} and POST
// /detokenize {"tokens": [ids]} as llama-server takes them.
std::string parse_tokenize_request(const std::string& body);
std::vector<int> parse_detokenize_request(const std::string& body, int vocab_size);

// Why a generation ended, as OpenAI names it: "stop" (an end-of-sequence
// id or a stop string), "length" (max_tokens or the context).
struct Usage {
  int prompt_tokens = 0, completion_tokens = 0;
  int prompt_fed = -1;  // of prompt_tokens, those computed (the rest were reused); -1: all
  double prompt_ms = 0, predicted_ms = 0;  // llama-server's timings
};
nlohmann::json usage_json(const Usage& u);
nlohmann::json timings_json(const Usage& u);

// A whole response (stream false).
nlohmann::json chat_response(const std::string& id, int64_t created, const std::string& model, const std::string& text, const std::string& finish_reason,
                             const Usage& usage);
nlohmann::json completion_response(const std::string& id, int64_t created, const std::string& model, const std::string& text,
                                   const std::string& finish_reason, const Usage& usage);

// Streamed: one chunk per piece of text (the first chat chunk carries the
// role), a last chunk with the finish reason (and, as llama-server's,
// usage and timings), then with include_usage a usage-only chunk, then
// "[DONE]". finish_reason empty: a content chunk.
nlohmann::json chat_chunk(const std::string& id, int64_t created, const std::string& model, const std::string& delta_text, bool first,
                          const std::string& finish_reason, const Usage* usage);
nlohmann::json completion_chunk(const std::string& id, int64_t created, const std::string& model, const std::string& text,
                                const std::string& finish_reason, const Usage* usage);
nlohmann::json usage_chunk(const std::string& id, int64_t created, const std::string& model, bool chat, const Usage& usage);
// "data: <json>\n\n"; sse_done() is "data: [DONE]\n\n".
std::string sse(const nlohmann::json& j);
std::string sse_done();

// GET /v1/models.
nlohmann::json models_list(const std::string& model, int64_t created);

}  // namespace coli::serve
