// Bad values and misleading messages (issue 15, items 5-10), mostly through
// the binaries as a user meets them: exit status 2 for usage, 1 for bad
// input, and one line on stderr that says what the thing is.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <thread>

#include "engine/generate.h"
#include "engine_util.h"
#include "model/model_spec.h"
#include "sampling/sampler.h"
#include "test_util.h"
#include "util/error.h"
#include "util/parse.h"

namespace fs = std::filesystem;

namespace {

std::string bin(const char* tool) { return coli::test::bin_dir() + "/" + tool; }
std::string text_model() { return coli::test::data_dir() + "/tiny-qwen35moe-text"; }

// Runs `cmd` with stderr folded into the captured output.
int run(const std::string& cmd, std::string* out) { return coli::test::run_command(cmd + " 2>&1", out); }

// A copy of the tiny text checkpoint whose config.json `edit` changes.
void copy_model(const std::string& to, const std::function<void(nlohmann::json&)>& edit = {}) {
  fs::create_directories(to);
  for (const auto& e : fs::directory_iterator(text_model())) fs::copy_file(e.path(), fs::path(to) / e.path().filename());
  if (edit) {
    auto cfg = nlohmann::json::parse(coli::test::read_file(to + "/config.json"));
    edit(cfg);
    fs::remove(to + "/config.json");
    coli::test::write_file(to + "/config.json", cfg.dump(2));
  }
}

// Overwrites every element of a bf16 tensor of a safetensors file with `bits`.
void fill_bf16(const std::string& file, const std::string& tensor, uint16_t bits) {
  std::string bytes = coli::test::read_file(file);
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  const auto h = nlohmann::json::parse(bytes.substr(8, n));
  ASSERT_TRUE(h.contains(tensor)) << tensor;
  ASSERT_EQ(h[tensor]["dtype"], "BF16");
  const uint64_t b = h[tensor]["data_offsets"][0], e = h[tensor]["data_offsets"][1];
  for (uint64_t i = 8 + n + b; i < 8 + n + e; i += 2) std::memcpy(&bytes[i], &bits, 2);
  fs::remove(file);
  coli::test::write_file(file, bytes);
}

const char* kSpec = R"({"model_type":"qwen3_5_moe_text","vocab_size":64,"hidden_size":32,"num_hidden_layers":4,
  "num_attention_heads":2,"num_key_value_heads":1,"head_dim":16,"linear_num_key_heads":1,"linear_num_value_heads":2,
  "linear_key_head_dim":8,"linear_value_head_dim":8,"linear_conv_kernel_dim":4,"num_experts":4,"num_experts_per_tok":2,
  "moe_intermediate_size":8,"shared_expert_intermediate_size":8,"max_position_embeddings":128)";

coli::ModelSpec spec_with(const std::string& extra) { return coli::parse_model_spec(std::string(kSpec) + extra + "}", "config.json"); }

using coli::test::error_of;

}  // namespace

// Item 5: thread counts far past the hardware are usage errors, not 32,000 threads.
TEST(Hardening, ThreadCountsAreBounded) {
  const int hw = std::max(1u, std::thread::hardware_concurrency());
  EXPECT_EQ(coli::check_thread_count(0, "-t"), 0);
  EXPECT_EQ(coli::check_thread_count(4 * hw, "-t"), 4 * hw);
  EXPECT_THROW(coli::check_thread_count(4 * hw + 1, "-t"), coli::UsageError);
  EXPECT_THROW(coli::check_thread_count(-1, "-t"), coli::UsageError);
  std::string out;
  EXPECT_EQ(run(bin("coli-run") + " -m " + text_model() + " --prompt-ids 1,2 -n 2 -t 100000", &out), 2);
  EXPECT_NE(out.find("--threads 100000 is more than 4x"), std::string::npos) << out;
  EXPECT_EQ(run(bin("coli-bench") + " -m " + text_model() + " -p 4 -n 0 -r 1 -t 1,100000", &out), 2);
  EXPECT_NE(out.find("-t 100000"), std::string::npos) << out;
  EXPECT_EQ(out.find("n_prompt"), std::string::npos) << "no record before the usage error: " << out;
  coli::test::TempDir d;
  EXPECT_EQ(run(bin("coli-convert") + " synth -o " + d / "s" + " --layers 1 -t 100000", &out), 2);
  EXPECT_NE(out.find("--threads"), std::string::npos) << out;
  EXPECT_FALSE(fs::exists(d / "s"));
  EXPECT_EQ(run(bin("coli-convert") + " " + text_model() + " -o " + d / "m.coli" + " -t -3", &out), 2);
  EXPECT_NE(out.find("must be >= 0"), std::string::npos) << out;
}

// Item 6: every float in config.json is finite, positive where it must be.
TEST(Hardening, ConfigFloatsAreChecked) {
  EXPECT_NO_THROW(spec_with(R"(,"rms_norm_eps":1e-6)"));
  EXPECT_NE(error_of([] { spec_with(R"(,"rms_norm_eps":-1)"); }).find("'rms_norm_eps' must be a positive number"), std::string::npos);
  EXPECT_NE(error_of([] { spec_with(R"(,"rms_norm_eps":0)"); }).find("rms_norm_eps"), std::string::npos);
  EXPECT_NE(error_of([] { spec_with(R"(,"rms_norm_eps":1e-300)"); }).find("underflows"), std::string::npos);
  EXPECT_NE(error_of([] { spec_with(R"(,"rope_theta":-5)"); }).find("'rope_theta' must be a positive number"), std::string::npos);
  EXPECT_NE(error_of([] { spec_with(R"(,"rope_parameters":{"rope_theta":0})"); }).find("rope_parameters: 'rope_theta'"), std::string::npos);
  // JSON has no NaN, and the parser refuses a literal that overflows to infinity.
  const std::string inf = error_of([] { spec_with(R"(,"router_aux_loss_coef":1e999)"); });
  EXPECT_NE(inf.find("config.json: not valid JSON"), std::string::npos) << inf;
  EXPECT_EQ(spec_with("").max_position_embeddings, 128);

  coli::test::TempDir d;
  copy_model(d / "m", [](nlohmann::json& c) { c["rms_norm_eps"] = -1; });
  std::string out;
  EXPECT_EQ(run(bin("coli-run") + " -m " + d / "m" + " --prompt-ids 1,2 -n 2 --temp 0", &out), 1);
  EXPECT_NE(out.find("'rms_norm_eps' must be a positive number"), std::string::npos) << out;
}

// Item 6: non-finite logits are an error naming the step, not null logprobs.
TEST(Hardening, NonFiniteLogitsNameTheStep) {
  std::vector<float> l = {0.f, 1.f, -std::numeric_limits<float>::infinity()};
  EXPECT_NEAR(std::exp(coli::log_softmax(l, "x")[1]), 1 / (1 + std::exp(-1.0)), 1e-6);  // -inf is a legal "never"
  l[0] = std::nanf("");
  const std::string e = error_of([&] { coli::log_softmax(l, "decode step 3"); });
  EXPECT_NE(e.find("decode step 3: the logits are not finite (id 0 is nan)"), std::string::npos) << e;
  l[0] = std::numeric_limits<float>::infinity();
  EXPECT_THROW(coli::log_softmax(l, "x"), coli::Error);

  coli::test::TempDir d;
  copy_model(d / "m");
  fill_bf16(d / "m/model.safetensors", "lm_head.weight", 0x7fc0);  // bf16 NaN
  std::string out;
  EXPECT_EQ(run(bin("coli-run") + " -m " + d / "m" + " --prompt-ids 1,2 -n 2 --json", &out), 1);
  EXPECT_NE(out.find("the prompt's forward pass: the logits are not finite"), std::string::npos) << out;
  EXPECT_EQ(out.find("null"), std::string::npos) << out;
  // Without --json no log-softmax is computed: the scan alone catches it.
  EXPECT_EQ(run(bin("coli-run") + " -m " + d / "m" + " --prompt-ids 1,2 -n 2 --temp 0", &out), 1);
  EXPECT_NE(out.find("the prompt's forward pass: the logits are not finite (id 0 is nan)"), std::string::npos) << out;
  std::vector<float> ok = {1.f, -std::numeric_limits<float>::infinity(), 3.f};
  EXPECT_NO_THROW(coli::check_logits_finite(ok, "x"));
  ok[2] = std::numeric_limits<float>::infinity();
  EXPECT_NE(error_of([&] { coli::check_logits_finite(ok, "decode step 9"); }).find("decode step 9: the logits are not finite (id 2 is inf)"),
            std::string::npos);
  EXPECT_THROW(coli::check_logits_finite({-std::numeric_limits<float>::infinity()}, "x"), coli::Error) << "all -inf";
  // A row of a batch, checked in place (coli-serve's slots): ids count from the row.
  const std::vector<float> rows = {1.f, 2.f, 5.f, std::numeric_limits<float>::quiet_NaN(), 0.f, 1.f};
  EXPECT_NO_THROW(coli::check_logits_finite(std::span<const float>(rows.data(), 3), "row 0"));
  EXPECT_NE(error_of([&] { coli::check_logits_finite(std::span<const float>(rows.data() + 3, 3), "row 1"); }).find("row 1: the logits are not finite (id 0 is nan)"),
            std::string::npos);
}

// Item 7: NaN, infinite and negative sampler settings are usage errors.
TEST(Hardening, SamplerSettingsAreChecked) {
  coli::SamplingParams p;
  EXPECT_NO_THROW(coli::check_sampling_params(p));
  for (float t : {std::nanf(""), std::numeric_limits<float>::infinity(), -1.f}) {
    p = {};
    p.temperature = t;
    EXPECT_THROW(coli::check_sampling_params(p), coli::UsageError) << t;
  }
  p = {};
  p.top_p = std::nanf("");
  EXPECT_THROW(coli::check_sampling_params(p), coli::UsageError);
  p = {};
  p.top_k = -5;
  EXPECT_THROW(coli::Sampler{p}, coli::UsageError);
  std::string out;
  for (const char* flag : {"--temp nan", "--temp inf", "--top-k -5", "--top-p nan", "--min-p nan", "--repeat-penalty inf", "--presence-penalty nan",
                           "--repeat-last-n -2"}) {
    EXPECT_EQ(run(bin("coli-run") + " -m " + text_model() + " --prompt-ids 1,2 -n 2 " + flag, &out), 2) << flag;
    const std::string name = std::string(flag).substr(0, std::string(flag).find(' '));
    EXPECT_NE(out.find(name + " must be"), std::string::npos) << flag << ": " << out;
  }
}

// Item 8: a context size, defaulting to the model's max_position_embeddings.
TEST(Hardening, ContextSizeStopsGeneration) {
  std::string out;
  // 3 prompt tokens in a context of 10: 7 generated, then a message.
  ASSERT_EQ(run(bin("coli-run") + " -m " + text_model() + " --prompt-ids 1,2,3 -n 100 --temp 0 --ignore-eos -c 10", &out), 0) << out;
  EXPECT_NE(out.find("the context is full (10 tokens, -c/--ctx-size): generation stopped after 7 tokens"), std::string::npos) << out;
  const std::string ids = out.substr(0, out.find('\n'));
  EXPECT_EQ(std::count(ids.begin(), ids.end(), ' '), 6) << ids;
  // A prompt that leaves no room is refused up front, with the numbers.
  EXPECT_EQ(run(bin("coli-run") + " -m " + text_model() + " --prompt-ids 1,2,3 -n 5 -c 3", &out), 1);
  EXPECT_NE(out.find("the prompt has 3 tokens: with one generated token that exceeds the context size of 3 tokens"), std::string::npos) << out;
  // The default is the model's 4,096 (tiny fixture's max_position_embeddings).
  std::string prompt = "1";
  for (int i = 1; i < 4096; ++i) prompt += ",1";
  EXPECT_EQ(run(bin("coli-run") + " -m " + text_model() + " --prompt-ids " + prompt + " -n 5", &out), 1);
  EXPECT_NE(out.find("context size of 4096 tokens"), std::string::npos) << out;
  EXPECT_EQ(run(bin("coli-run") + " -m " + text_model() + " --prompt-ids 1 -c -1", &out), 2);
  // coli-bench: a test beyond the model's context is an error record.
  EXPECT_EQ(coli::test::run_command(bin("coli-bench") + " -m " + text_model() + " -p 5000 -n 0 -r 1 -o jsonl 2>/dev/null", &out), 1);
  const auto rec = nlohmann::json::parse(out.substr(0, out.find('\n')));
  ASSERT_TRUE(rec.contains("error")) << out;
  EXPECT_NE(rec["error"].get<std::string>().find("exceed the model's context of 4096"), std::string::npos) << out;
}

// Item 9: messages say what the thing is and what was expected.
TEST(Hardening, MessagesSayWhatTheThingIs) {
  coli::test::TempDir d;
  std::string out;
  ASSERT_EQ(run(bin("coli-convert") + " " + text_model() + " -o " + d / "m.coli" + " -t 2 --no-verify", &out), 0) << out;
  EXPECT_EQ(run(bin("coli-convert") + " " + d / "m.coli" + " -o " + d / "x.coli", &out), 1);
  EXPECT_NE(out.find("m.coli: is a coli container, not a checkpoint directory"), std::string::npos) << out;
  EXPECT_EQ(run(bin("coli-convert") + " verify " + text_model(), &out), 1);
  EXPECT_NE(out.find("is a directory; expected a coli container file (this is a checkpoint directory"), std::string::npos) << out;
  EXPECT_EQ(run(bin("coli-convert") + " frobnicate", &out), 2);
  EXPECT_NE(out.find("'frobnicate' is neither a subcommand"), std::string::npos) << out;
  EXPECT_EQ(run(bin("coli-run") + " -m " + d / "nothing" + " --prompt-ids 1", &out), 1);
  EXPECT_NE(out.find("nothing: no such file or directory"), std::string::npos) << out;
  // The real Qwen3 tokenizer's ids do not fit the tiny model's vocabulary.
  EXPECT_EQ(run(bin("coli-run") + " -m " + text_model() + " --tokenizer " + coli::test::data_dir() + "/qwen3-tokenizer -p hello -n 1", &out), 1);
  EXPECT_NE(out.find("does not match the model"), std::string::npos) << out;
  EXPECT_EQ(out.find("outside the vocabulary"), std::string::npos) << out;
  // Garbage in config.json: say it is not JSON, and where.
  copy_model(d / "g");
  fs::remove(d / "g/config.json");
  coli::test::write_file(d / "g/config.json", "model_type: qwen3_5_moe\n");
  EXPECT_EQ(run(bin("coli-run") + " -m " + d / "g" + " --prompt-ids 1", &out), 1);
  EXPECT_NE(out.find("config.json: not valid JSON"), std::string::npos) << out;
  EXPECT_EQ(out.find("unexpected end of input"), std::string::npos) << out;
}

// Item 10: what the tools print.
TEST(Hardening, ToolsPrintWhatTheyShould) {
  std::string out;
  ASSERT_EQ(coli::test::run_command(bin("coli-run") + " --help", &out), 0);
  EXPECT_EQ(out.find("0.800000"), std::string::npos) << "defaults print as typed";
  EXPECT_NE(out.find("(=0.8)"), std::string::npos) << out;
  EXPECT_NE(out.find("--ctx-size"), std::string::npos);
  // --json with --prompt-ids still carries the text when there is a tokenizer.
  const std::string json_run = bin("coli-run") + " -m " + text_model() + " --prompt-ids 1,2 -n 2 --temp 0 --json";
  ASSERT_EQ(coli::test::run_command(json_run + " --tokenizer " + coli::test::data_dir() + "/tiny-tokenizer 2>/dev/null", &out), 0);
  EXPECT_EQ(nlohmann::json::parse(out.substr(0, out.find('\n')))["text"], "\xef\xbf\xbd") << out;  // id 136: a lone byte, shown as U+FFFD
  ASSERT_EQ(coli::test::run_command(json_run + " 2>/dev/null", &out), 0);  // this checkpoint has no tokenizer.json
  EXPECT_FALSE(nlohmann::json::parse(out.substr(0, out.find('\n'))).contains("text")) << out;
  // No GPU notice on a CPU run unless asked for.
  ASSERT_EQ(coli::test::run_command(bin("coli-run") + " -m " + text_model() + " --prompt-ids 1,2 -n 2 --temp 0 2>&1 >/dev/null", &out), 0);
  EXPECT_EQ(out.find("no CUDA device used"), std::string::npos) << out;
  // coli-bench with nothing to run says so.
  EXPECT_EQ(run(bin("coli-bench") + " -m " + text_model() + " -p 0 -n 0", &out), 2);
  EXPECT_NE(out.find("nothing to run"), std::string::npos) << out;
  // A first token that ends the sequence: no decode step, no "0.0 tok/s".
  const auto& golden = coli::test::tiny_goldens()["prompts"][0];
  const int first = golden["greedy"][0];
  std::string ids;
  for (int id : golden["ids"]) ids += (ids.empty() ? "" : ",") + std::to_string(id);
  coli::test::TempDir d;
  copy_model(d / "m", [&](nlohmann::json& c) { c["eos_token_id"] = first; });
  ASSERT_EQ(run(bin("coli-run") + " -m " + d / "m" +  " --prompt-ids " + ids + " -n 8 --temp 0", &out), 0) << out;
  EXPECT_NE(out.find("no decode step (1 token)"), std::string::npos) << out;
  EXPECT_EQ(out.find(" 0.0 tok/s"), std::string::npos) << out;  // a rate of zero ("140.0 tok/s" is a prefill rate)
}
