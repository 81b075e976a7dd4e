// The tokenizer against ids produced by HF tokenizers (and chat prompts
// rendered by transformers' apply_chat_template) for the real Qwen3
// tokenizer: tests/data/goldens/qwen3-tokenizer.json, made by
// scripts/make_tokenizer_goldens.py.
#include "tokenizer/tokenizer.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "test_util.h"
#include "tokenizer/chat.h"
#include "tokenizer/utf8.h"
#include "util/error.h"

using namespace coli;

namespace {

const Tokenizer& qwen() {
  static const auto t = Tokenizer::load(test::data_dir() + "/qwen3-tokenizer");
  return *t;
}
const nlohmann::json& goldens() {
  static const auto g = nlohmann::json::parse(test::read_file(test::data_dir() + "/goldens/qwen3-tokenizer.json"));
  return g;
}

std::string show(const std::vector<int>& v) {
  std::string s;
  for (int x : v) s += std::to_string(x) + " ";
  return s;
}

}  // namespace

TEST(Tokenizer, EveryReferenceStringEncodesIdentically) {
  int total = 0, same = 0;
  for (const auto& c : goldens()["cases"]) {
    const std::string text = c["text"];
    const std::vector<int> want = c["ids"];
    const std::vector<int> got = qwen().encode(text);
    ++total;
    if (got == want) ++same;
    else ADD_FAILURE() << "[" << c["cat"] << "] " << nlohmann::json(text).dump() << "\n  got  " << show(got) << "\n  want " << show(want);
  }
  std::printf("[ info     ] %d / %d reference strings identical\n", same, total);
  EXPECT_GE(total, 300);
}

TEST(Tokenizer, DecodeMatchesReferenceAndRoundTripsToNfc) {
  for (const auto& c : goldens()["cases"]) {
    const std::vector<int> ids = c["ids"];
    const std::string decoded = c["decoded"];  // HF's decode: NFC of the text
    EXPECT_EQ(qwen().decode(ids), decoded) << nlohmann::json(c["text"]).dump();
    EXPECT_EQ(qwen().decode(qwen().encode(c["text"].get<std::string>())), decoded);
  }
}

TEST(Tokenizer, StreamingDecodeNeverEmitsBrokenUtf8) {
  for (const auto& c : goldens()["cases"]) {
    const std::vector<int> ids = c["ids"];
    Utf8Stream st;
    std::string all;
    for (int id : ids) {
      const std::string piece = st.push(qwen().token_bytes(id));
      ASSERT_TRUE(utf8_is_valid(piece));
      all += piece;
    }
    all += st.flush();
    EXPECT_EQ(all, c["decoded"].get<std::string>());
  }
}

TEST(Tokenizer, ChatRenderingsMatchTransformers) {
  const ChatStyle style = chat_style_of(qwen().chat_template());
  for (const auto& c : goldens()["chats"]) {
    const auto msgs = parse_chat_messages(c["messages"].dump(), "chat");
    ChatOptions opt;
    opt.add_generation_prompt = c["add_generation_prompt"];
    if (c.contains("enable_thinking")) opt.enable_thinking = c["enable_thinking"].get<bool>();
    const std::string text = render_chat(msgs, opt, style);
    EXPECT_EQ(text, c["rendered"].get<std::string>()) << c["messages"].dump();
    EXPECT_EQ(qwen().encode(text), c["ids"].get<std::vector<int>>());
  }
}

TEST(Tokenizer, SpecialTokensAndLookup) {
  EXPECT_EQ(qwen().find("<|im_end|>"), 151645);
  EXPECT_EQ(qwen().find("<think>"), 151667);
  EXPECT_EQ(qwen().find(" the").value_or(-1), qwen().encode(" the")[0]);
  EXPECT_TRUE(qwen().is_special(151645));
  EXPECT_FALSE(qwen().is_special(151667));  // <think> is added but not special
  EXPECT_EQ(qwen().eos_token(), "<|im_end|>");
  const std::vector<int> ids = qwen().encode("<|im_start|>hi<|im_end|>");
  EXPECT_EQ(qwen().decode(ids, /*skip_special=*/true), "hi");
  EXPECT_THROW(qwen().token_bytes(10000000), Error);
}

TEST(Tokenizer, InvalidUtf8InputIsRepairedNotRejected) {
  EXPECT_EQ(qwen().decode(qwen().encode("a\xff" "b")), "a\xEF\xBF\xBD" "b");
}

TEST(Utf8, LossyFollowsMaximalSubparts) {
  const std::string R = "\xEF\xBF\xBD";
  EXPECT_EQ(utf8_lossy("ok"), "ok");
  EXPECT_EQ(utf8_lossy("\xC3"), R);
  EXPECT_EQ(utf8_lossy("\xE2\x82"), R);                // cut 3-byte char: one
  EXPECT_EQ(utf8_lossy("\xF0\x80\x80"), R + R + R);    // F0 80 is not a prefix
  EXPECT_EQ(utf8_lossy("\xED\xA0\x80"), R + R + R);    // surrogate
  EXPECT_EQ(utf8_lossy("\xC0\xAF"), R + R);            // overlong
  EXPECT_EQ(utf8_lossy("a\xE2\x82" "b"), "a" + R + "b");
  EXPECT_EQ(utf8_lossy("\xF4\x90\x80\x80"), R + R + R + R);  // > U+10FFFF
}

TEST(Utf8, StreamHoldsCutCharacters) {
  Utf8Stream s;
  EXPECT_EQ(s.push("a\xE2"), "a");
  EXPECT_EQ(s.push("\x82"), "");
  EXPECT_EQ(s.push("\xAC!"), "\xE2\x82\xAC!");
  EXPECT_EQ(s.push("\xF0\x9F"), "");
  EXPECT_EQ(s.flush(), "\xEF\xBF\xBD");
  EXPECT_EQ(s.push("\xFF" "x"), "\xEF\xBF\xBDx");
}

namespace {
std::string tiny_tokenizer(const std::string& model_extra, const std::string& pre = R"({"type":"ByteLevel","add_prefix_space":false,"use_regex":true})") {
  std::string vocab = "{";
  for (int b = 0; b < 256; ++b) {
    // Every byte's alphabet character, as a JSON string.
    std::string ch;
    utf8_append(ch, b >= '!' && b <= '~' ? b : 0x100 + b);  // not the real alphabet: only shape matters here
    vocab += (b ? "," : "") + nlohmann::json(ch).dump() + ":" + std::to_string(b);
  }
  vocab += "}";
  return R"({"model":{"type":"BPE","vocab":)" + vocab + "," + model_extra + R"(},"pre_tokenizer":)" + pre + "}";
}
std::string load_error(const std::string& j) {
  try {
    Tokenizer::from_json(j, "", "t.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST(TokenizerLoad, BadFilesNameTheField) {
  EXPECT_NE(load_error("{").find("t.json: not valid JSON"), std::string::npos);
  EXPECT_NE(load_error(R"({"model":{"type":"WordPiece"}})").find("model.type"), std::string::npos);
  EXPECT_NE(load_error(tiny_tokenizer(R"("merges":[["a","zz"]])")).find("model.merges[0]"), std::string::npos);
  EXPECT_NE(load_error(tiny_tokenizer(R"("merges":[])", R"({"type":"Whitespace"})")).find("pre_tokenizer"), std::string::npos);
  EXPECT_NE(load_error(tiny_tokenizer(R"("merges":[])", R"({"type":"Sequence","pretokenizers":[{"type":"Split","pattern":{"Regex":"(unclosed"},"behavior":"Isolated"},{"type":"ByteLevel","use_regex":false}]})"))
                .find("regex does not compile"),
            std::string::npos);
  EXPECT_EQ(load_error(tiny_tokenizer(R"("merges":[])")), "");
}

TEST(Chat, RefusesNonChatMlTemplatesAndUnknownRoles) {
  EXPECT_THROW(chat_style_of("{{ bos_token }}{% for m in messages %}[INST]{{ m.content }}{% endfor %}"), Error);
  EXPECT_THROW(parse_chat_messages(R"([{"role":"wizard","content":"x"}])", "m.json"), Error);
  EXPECT_THROW(parse_chat_messages(R"({"role":"user"})", "m.json"), Error);
  const auto m = parse_chat_messages(R"([{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}])", "m.json");
  EXPECT_EQ(m[0].content, "ab");
  // A template that thinks by default opens the block in the generation prompt.
  ChatStyle s = chat_style_of("<|im_start|><|im_end|>{%- if add_generation_prompt %}{%- if enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- else %}{{- '<think>\\n' }}{%- endif %}{%- endif %}");
  EXPECT_TRUE(s.opens_think);
  EXPECT_EQ(render_chat({{"user", "hi", {}}}, {}, s), "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n");
}

TEST(Tokenizer, TinyTokenizerMatchesHfToo) {
  // A second, made-up vocabulary (scripts/make_tiny_tokenizer.py) checked by
  // HF tokenizers on the same strings: the loader is not tuned to one file.
  static const auto tiny = Tokenizer::load(test::data_dir() + "/tiny-tokenizer");
  const auto g = nlohmann::json::parse(test::read_file(test::data_dir() + "/goldens/tiny-tokenizer.json"));
  int same = 0, total = 0;
  for (const auto& c : g["cases"]) {
    ++total;
    const std::vector<int> got = tiny->encode(c["text"].get<std::string>());
    if (got == c["ids"].get<std::vector<int>>()) ++same;
    else ADD_FAILURE() << nlohmann::json(c["text"]).dump() << "\n  got  " << show(got) << "\n  want " << show(c["ids"]);
    EXPECT_EQ(tiny->decode(got), c["decoded"].get<std::string>());
  }
  std::printf("[ info     ] tiny tokenizer: %d / %d identical\n", same, total);
}

TEST(Tokenizer, WordCacheDoesNotChangeResults) {
  const std::string s = goldens()["cases"][300]["text"];
  qwen().clear_cache();
  const auto cold = qwen().encode(s);
  const auto warm = qwen().encode(s);
  EXPECT_EQ(cold, warm);
  WordCache c(4);  // tiny: fills and restarts
  std::vector<int> out;
  for (int i = 0; i < 20; ++i) {
    const std::string w = "w" + std::to_string(i);
    const int ids[2] = {i, -i};
    c.put(w, ids, 2);
    out.clear();
    ASSERT_TRUE(c.get(w, out));
    EXPECT_EQ(out, (std::vector<int>{i, -i}));
  }
  EXPECT_LE(c.size(), 4u);
}
