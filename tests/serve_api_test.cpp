// coli-serve's API layer (serve/openai_api.h, serve/stop_strings.h): the
// request fields OpenAI clients send, checked, with OpenAI's defaults; the
// errors each bad field earns (status, type, param, one message naming the
// field); the response and stream chunk shapes clients parse; stop strings
// split across streamed pieces.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "serve/openai_api.h"
#include "serve/stop_strings.h"

using namespace coli::serve;
using nlohmann::json;

namespace {

ApiLimits limits() {
  ApiLimits l;
  l.model_name = "tiny";
  l.max_tokens_limit = 100;
  return l;
}

// The ApiError a chat body earns (status 0: none).
ApiError chat_error(const std::string& body) {
  try {
    parse_chat_request(body, limits());
  } catch (const ApiError& e) {
    return e;
  }
  return ApiError(0, "", "");
}

}  // namespace

TEST(ServeApi, ChatRequestFieldsAndDefaults) {
  const GenerationRequest r = parse_chat_request(
      R"({"model":"tiny","messages":[{"role":"developer","content":"be brief"},{"role":"user","content":[{"type":"text","text":"hi "},{"type":"text","text":"there"}]},
          {"role":"assistant","content":"ok","reasoning_content":"think"},{"role":"user","content":"more"}],
          "stream":true,"stream_options":{"include_usage":true},"max_tokens":16,"temperature":0.5,"top_p":0.9,"top_k":7,"min_p":0.1,"seed":42,
          "stop":["\n\n","END"],"chat_template_kwargs":{"enable_thinking":false}})",
      limits());
  EXPECT_TRUE(r.chat);
  ASSERT_EQ(r.messages.size(), 4u);
  EXPECT_EQ(r.messages[0].role, "system") << "developer is OpenAI's newer name for system";
  EXPECT_EQ(r.messages[1].content, "hi there");
  EXPECT_EQ(r.messages[2].reasoning_content, std::optional<std::string>("think"));
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
  EXPECT_EQ(r.max_tokens, 16);
  EXPECT_FLOAT_EQ(r.sampling.temperature, 0.5f);
  EXPECT_FLOAT_EQ(r.sampling.top_p, 0.9f);
  EXPECT_EQ(r.sampling.top_k, 7);
  EXPECT_FLOAT_EQ(r.sampling.min_p, 0.1f);
  EXPECT_TRUE(r.seeded);
  EXPECT_EQ(r.sampling.seed, 42u);
  EXPECT_EQ(r.stop, (std::vector<std::string>{"\n\n", "END"}));
  EXPECT_EQ(r.enable_thinking, std::optional<bool>(false));
  // OpenAI's defaults: temperature 1, top_p 1, no top-k or min-p, no stop, model optional.
  const GenerationRequest d = parse_chat_request(R"({"messages":[{"role":"user","content":"x"}]})", limits());
  EXPECT_FLOAT_EQ(d.sampling.temperature, 1.0f);
  EXPECT_FLOAT_EQ(d.sampling.top_p, 1.0f);
  EXPECT_EQ(d.sampling.top_k, 0);
  EXPECT_FLOAT_EQ(d.sampling.min_p, 0.0f);
  EXPECT_FALSE(d.stream);
  EXPECT_FALSE(d.seeded);
  EXPECT_EQ(d.max_tokens, 0);
  EXPECT_TRUE(d.stop.empty());
  // A huge max_tokens is cut to the server's limit; max_completion_tokens is OpenAI's newer name.
  EXPECT_EQ(parse_chat_request(R"({"messages":[{"role":"user","content":"x"}],"max_tokens":1000000000})", limits()).max_tokens, 100);
  EXPECT_EQ(parse_chat_request(R"({"messages":[{"role":"user","content":"x"}],"max_completion_tokens":5})", limits()).max_tokens, 5);
  EXPECT_EQ(parse_chat_request(R"({"messages":[{"role":"user","content":"x"}],"stop":"##"})", limits()).stop, std::vector<std::string>{"##"});
}

TEST(ServeApi, BadFieldsAreNamedWithTheirStatus) {
  const struct {
    const char* body;
    int status;
    const char* param;
    const char* says;
  } cases[] = {
      {"not json", 400, "", "not valid JSON"},
      {"[1,2]", 400, "", "must be a JSON object"},
      {R"({"messages":"hi"})", 400, "messages", "must be a non-empty list"},
      {R"({})", 400, "messages", "is required"},
      {R"({"messages":[]})", 400, "messages", "non-empty"},
      {R"({"messages":[{"role":"wizard","content":"x"}]})", 400, "messages[0].role", "not 'wizard'"},
      {R"({"messages":[{"content":"x"}]})", 400, "messages[0].role", "must be a string"},
      {R"({"messages":[{"role":"user"}]})", 400, "messages[0].content", "is required"},
      {R"({"messages":[{"role":"system","content":null},{"role":"user","content":"x"}]})", 400, "messages[0].content", "is required"},
      {R"({"messages":[{"role":"user","content":[{"type":"image_url","image_url":{}}]}]})", 400, "messages[0].content", "only text"},
      {R"({"model":"gpt-4","messages":[{"role":"user","content":"x"}]})", 404, "model", "'gpt-4' does not exist"},
      {R"({"model":7,"messages":[{"role":"user","content":"x"}]})", 400, "model", "must be a string"},
      {R"({"messages":[{"role":"user","content":"x"}],"temperature":-1})", 400, "temperature", "must be in [0.0, 2.0]"},
      {R"({"messages":[{"role":"user","content":"x"}],"temperature":"hot"})", 400, "temperature", "must be a number"},
      {R"({"messages":[{"role":"user","content":"x"}],"top_p":0})", 400, "top_p", "greater than 0"},
      {R"({"messages":[{"role":"user","content":"x"}],"top_k":-3})", 400, "top_k", "must be in"},
      {R"({"messages":[{"role":"user","content":"x"}],"max_tokens":0})", 400, "max_tokens", "must be in [1,"},
      {R"({"messages":[{"role":"user","content":"x"}],"max_tokens":1.5})", 400, "max_tokens", "must be an integer"},
      {R"({"messages":[{"role":"user","content":"x"}],"max_tokens":18446744073709551615})", 400, "max_tokens", "must be in"},
      {R"({"messages":[{"role":"user","content":"x"}],"n":2})", 400, "n", "must be in [1, 1]"},
      {R"({"messages":[{"role":"user","content":"x"}],"stream":"yes"})", 400, "stream", "true or false"},
      {R"({"messages":[{"role":"user","content":"x"}],"stop":[1]})", 400, "stop", "list of strings"},
      {R"({"messages":[{"role":"user","content":"x"}],"stop":["a","b","c","d","e"]})", 400, "stop", "at most 4"},
      {R"({"messages":[{"role":"user","content":"x"}],"stop":[""]})", 400, "stop", "empty string"},
      {R"({"messages":[{"role":"user","content":"x"}],"seed":"abc"})", 400, "seed", "must be an integer"},
      {"{\"messages\":[{\"role\":\"user\",\"content\":\"\xff\xfe\"}]}", 400, "", "not valid JSON"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.body);
    const ApiError e = chat_error(c.body);
    EXPECT_EQ(e.status(), c.status);
    EXPECT_EQ(e.param(), c.param);
    EXPECT_NE(std::string(e.what()).find(c.says), std::string::npos) << e.what();
    const json b = json::parse(error_body(e));
    EXPECT_EQ(b["error"]["message"], e.what());
    EXPECT_EQ(b["error"]["type"], c.status == 404 ? "invalid_request_error" : e.type());
    if (*c.param) EXPECT_EQ(b["error"]["param"], c.param);
    else EXPECT_TRUE(b["error"]["param"].is_null());
  }
}

TEST(ServeApi, CompletionTokenizeAndDetokenizeBodies) {
  const GenerationRequest r = parse_completion_request(R"({"prompt":"Once","max_tokens":3,"temperature":0})", limits());
  EXPECT_FALSE(r.chat);
  EXPECT_EQ(r.prompt, "Once");
  EXPECT_EQ(r.max_tokens, 3);
  EXPECT_FLOAT_EQ(r.sampling.temperature, 0.0f);
  EXPECT_EQ(parse_completion_request(R"({"prompt":["Twice"]})", limits()).prompt, "Twice");
  EXPECT_THROW(parse_completion_request(R"({"prompt":[1,2,3]})", limits()), ApiError);
  EXPECT_THROW(parse_completion_request(R"({"max_tokens":3})", limits()), ApiError);
  EXPECT_EQ(parse_tokenize_request(R"({"content":"Hello"})"), "Hello");
  EXPECT_THROW(parse_tokenize_request(R"({"content":5})"), ApiError);
  EXPECT_EQ(parse_detokenize_request(R"({"tokens":[0,5,9]})", 10), (std::vector<int>{0, 5, 9}));
  try {
    parse_detokenize_request(R"({"tokens":[3,10]})", 10);
    FAIL();
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status(), 400);
    EXPECT_NE(std::string(e.what()).find("[0, 10), not 10"), std::string::npos) << e.what();
  }
}

// The shapes the openai client libraries and llama-server clients read.
TEST(ServeApi, ResponsesAndStreamChunks) {
  Usage u;
  u.prompt_tokens = 5, u.completion_tokens = 3, u.prompt_ms = 10, u.predicted_ms = 30;
  const json r = chat_response("chatcmpl-1", 1700000000, "tiny", "Hello", "stop", u);
  EXPECT_EQ(r["object"], "chat.completion");
  EXPECT_EQ(r["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(r["choices"][0]["message"]["content"], "Hello");
  EXPECT_EQ(r["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(r["usage"]["total_tokens"], 8);
  EXPECT_EQ(r["timings"]["prompt_n"], 5);
  EXPECT_DOUBLE_EQ(r["timings"]["predicted_per_second"].get<double>(), 100.0);
  const json c = completion_response("cmpl-1", 1, "tiny", "abc", "length", u);
  EXPECT_EQ(c["object"], "text_completion");
  EXPECT_EQ(c["choices"][0]["text"], "abc");
  EXPECT_EQ(c["choices"][0]["finish_reason"], "length");
  const json first = chat_chunk("chatcmpl-1", 1, "tiny", "He", true, "", nullptr);
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ(first["choices"][0]["delta"]["content"], "He");
  EXPECT_TRUE(first["choices"][0]["finish_reason"].is_null());
  EXPECT_FALSE(first.contains("usage"));
  const json next = chat_chunk("chatcmpl-1", 1, "tiny", "llo", false, "", nullptr);
  EXPECT_FALSE(next["choices"][0]["delta"].contains("role"));
  const json last = chat_chunk("chatcmpl-1", 1, "tiny", "", false, "stop", &u);
  EXPECT_EQ(last["choices"][0]["finish_reason"], "stop");
  EXPECT_FALSE(last["choices"][0]["delta"].contains("content"));
  EXPECT_EQ(last["usage"]["completion_tokens"], 3);
  EXPECT_EQ(last["timings"]["predicted_n"], 3);
  const json uc = usage_chunk("chatcmpl-1", 1, "tiny", true, u);
  EXPECT_TRUE(uc["choices"].empty());
  EXPECT_EQ(uc["usage"]["prompt_tokens"], 5);
  EXPECT_EQ(sse(json{{"a", 1}}), "data: {\"a\":1}\n\n");
  EXPECT_EQ(sse_done(), "data: [DONE]\n\n");
  // A model's invalid UTF-8 goes out replaced, not as an exception.
  EXPECT_NE(sse(chat_chunk("x", 1, "tiny", std::string("\xe2\x82"), false, "", nullptr)).find("\xef\xbf\xbd"), std::string::npos);
  const json m = models_list("tiny", 7);
  EXPECT_EQ(m["object"], "list");
  EXPECT_EQ(m["data"][0]["id"], "tiny");
  EXPECT_EQ(m["data"][0]["object"], "model");
}

TEST(ServeApi, StopStringsAcrossPieces) {
  StopStrings s({"END", "\n\n"});
  std::string sent;
  for (const char* piece : {"Hello", " E", "N", "ough", " and E", "N", "D more"}) {
    const StopStrings::Out o = s.push(piece);
    sent += o.text;
    if (o.stopped) break;
  }
  EXPECT_EQ(sent, "Hello ENough and ") << "held back 'E', 'EN' until they could not start END, then stopped before END";
  EXPECT_TRUE(s.push("x").stopped);
  EXPECT_EQ(s.flush(), "");
  // No stop: the held tail comes out at the end.
  StopStrings t({"\n\n"});
  EXPECT_EQ(t.push("a\n").text, "a");
  EXPECT_EQ(t.flush(), "\n");
  // Two stops: the earliest wins.
  StopStrings u({"cd", "bc"});
  const StopStrings::Out o = u.push("abcde");
  EXPECT_TRUE(o.stopped);
  EXPECT_EQ(o.text, "a");
  // None given: everything passes.
  StopStrings none({});
  EXPECT_EQ(none.push("abc").text, "abc");
}
