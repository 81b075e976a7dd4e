// libFuzzer target: coli-serve's request bodies (serve/openai_api.h) on
// arbitrary bytes, as /v1/chat/completions, /v1/completions, /tokenize and
// /detokenize take them. Each must give a request within the API's bounds
// or throw ApiError with a status of 400 or 404, never anything else; the
// error's body must be JSON whatever bytes the message quotes.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>

#include "serve/openai_api.h"

namespace {

void check_error(const coli::serve::ApiError& e) {
  if (e.status() != 400 && e.status() != 404) std::abort();
  const auto j = nlohmann::json::parse(coli::serve::error_body(e), nullptr, false);
  if (j.is_discarded() || !j.contains("error")) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string body(reinterpret_cast<const char*>(data), size);
  coli::serve::ApiLimits lim;
  lim.model_name = "coli", lim.max_tokens_limit = 4096;
  for (int which = 0; which < 4; ++which) {
    try {
      if (which < 2) {
        const coli::serve::GenerationRequest r = which == 0 ? coli::serve::parse_chat_request(body, lim) : coli::serve::parse_completion_request(body, lim);
        if (r.max_tokens < 0 || r.max_tokens > 4096 || r.stop.size() > lim.max_stop || !(r.sampling.temperature >= 0) || !(r.sampling.top_p > 0) ||
            r.sampling.top_p > 1 || (which == 0 && r.messages.empty()))
          std::abort();
      } else if (which == 2) {
        coli::serve::parse_tokenize_request(body);
      } else {
        for (int id : coli::serve::parse_detokenize_request(body, 1000))
          if (id < 0 || id >= 1000) std::abort();
      }
    } catch (const coli::serve::ApiError& e) {
      check_error(e);
    }
  }
  return 0;
}
