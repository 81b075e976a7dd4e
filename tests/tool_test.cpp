// coli-run as a user runs it: output format and exit status.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>

#include "engine_util.h"
#include "formats/safetensors.h"
#include "formats/dtype.h"
#include "test_util.h"

namespace {

std::string coli_run() { return coli::test::bin_dir() + "/coli-run"; }
std::string text_model() { return coli::test::data_dir() + "/tiny-qwen35moe-text"; }

std::string join_ids(const std::vector<int>& v, const char* sep) {
  std::string s;
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? sep : "") + std::to_string(v[i]);
  return s;
}

const nlohmann::json& prompt(int i) {
  return coli::test::tiny_goldens()["prompts"][i];
}

}  // namespace

TEST(ColiRun, GreedyIdsOnOneLine) {
  const auto& p = prompt(1);
  std::string out;
  const int rc = coli::test::run_command(
      coli_run() + " --model " + text_model() + " --prompt-ids " + join_ids(p["ids"], ",") + " -n 16 --temp 0 --ignore-eos 2>/dev/null", &out);
  EXPECT_EQ(rc, 0);
  EXPECT_EQ(out, join_ids(p["greedy"], " ") + "\n");
}

TEST(ColiRun, JsonWithTopLogprobs) {
  const auto& p = prompt(0);
  std::string out;
  const int rc = coli::test::run_command(coli_run() + " --model " + text_model() + " --prompt-ids " + join_ids(p["ids"], ",") +
                                             " -n 3 --temp 0 --json --top-logprobs 5 --ignore-eos 2>/dev/null",
                                         &out);
  ASSERT_EQ(rc, 0);
  std::istringstream in(out);
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line);
    EXPECT_EQ(j["id"].get<int>(), p["greedy"][n].get<int>());
    ASSERT_EQ(j["top_logprobs"].size(), 5u);
    EXPECT_EQ(j["top_logprobs"][0]["id"], j["id"]);  // greedy picks the most likely
    EXPECT_LE(j["top_logprobs"][1]["logprob"].get<float>(), j["top_logprobs"][0]["logprob"].get<float>());
    EXPECT_LT(j["logprob"].get<float>(), 0.0f);
    ++n;
  }
  EXPECT_EQ(n, 3);
}

TEST(ColiRun, StatsLineOnStderr) {
  std::string out;
  coli::test::run_command(coli_run() + " --model " + text_model() + " --prompt-ids 1,2,3 -n 2 2>&1 >/dev/null", &out);
  EXPECT_NE(out.find("prompt 3 tokens"), std::string::npos) << out;
  EXPECT_NE(out.find("prefill"), std::string::npos);
  EXPECT_NE(out.find("decode"), std::string::npos);
}

TEST(ColiRun, UsageErrorsExit2) {
  std::string out;
  EXPECT_EQ(coli::test::run_command(coli_run() + " --prompt-ids 1 2>&1", &out), 2);
  EXPECT_NE(out.find("--model"), std::string::npos) << out;
  EXPECT_EQ(coli::test::run_command(coli_run() + " --model x --prompt-ids 1,,2 2>&1", &out), 2);
  EXPECT_NE(out.find("--prompt-ids"), std::string::npos) << out;
  EXPECT_EQ(coli::test::run_command(coli_run() + " --bogus 2>&1", &out), 2);
  EXPECT_EQ(coli::test::run_command(coli_run() + " --help", &out), 0);
  EXPECT_NE(out.find("--prompt-ids"), std::string::npos);
}

TEST(ColiRun, BadInputExits1WithOneLine) {
  coli::test::TempDir d;
  std::string out;
  // Another model_type.
  coli::test::write_file(d / "config.json", R"({"model_type":"llama"})");
  EXPECT_EQ(coli::test::run_command(coli_run() + " --model " + d.path() + " --prompt-ids 1 2>&1", &out), 1);
  EXPECT_NE(out.find("model_type 'llama'"), std::string::npos) << out;
  // Truncated safetensors.
  std::filesystem::copy_file(text_model() + "/config.json", d / "config.json", std::filesystem::copy_options::overwrite_existing);
  const std::string st = coli::test::read_file(text_model() + "/model.safetensors");
  coli::test::write_file(d / "model.safetensors", st.substr(0, st.size() / 2));
  EXPECT_EQ(coli::test::run_command(coli_run() + " --model " + d.path() + " --prompt-ids 1 2>&1", &out), 1);
  EXPECT_NE(out.find("truncated"), std::string::npos) << out;
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << out;
  // Corrupt header.
  coli::test::write_file(d / "model.safetensors", std::string("\x10\0\0\0\0\0\0\0{garbage!!!!!!!}", 24));
  EXPECT_EQ(coli::test::run_command(coli_run() + " --model " + d.path() + " --prompt-ids 1 2>&1", &out), 1);
  EXPECT_NE(out.find("corrupt safetensors header"), std::string::npos) << out;
  // A missing tensor: a checkpoint holding only the embedding.
  std::vector<uint16_t> emb(512 * 64, 0x3f80);
  coli::test::write_file(d / "model.safetensors",
                         coli::test::safetensors_bytes({{"model.embed_tokens.weight", "BF16", {512, 64}, coli::test::pod_bytes(emb)}}));
  EXPECT_EQ(coli::test::run_command(coli_run() + " --model " + d.path() + " --prompt-ids 1 2>&1", &out), 1);
  EXPECT_NE(out.find("missing tensor 'model.norm.weight'"), std::string::npos) << out;
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << out;
  // Token id outside the vocabulary.
  EXPECT_EQ(coli::test::run_command(coli_run() + " --model " + text_model() + " --prompt-ids 1,99999 2>&1", &out), 1);
  EXPECT_NE(out.find("99999"), std::string::npos) << out;
}

// Issue 31's bad input on the other families' fixtures: a missing tensor
// (a qwen3_next checkpoint without a layer's fused DeltaNet projection),
// num_experts_per_tok above num_experts, zero experts: one line naming the
// tensor or the field, exit 1. And the families run: greedy tokens of
// coli-run --temp 0 are the transformers goldens'.
TEST(ColiRun, OtherFamiliesRunAndBadInputExits1WithOneLine) {
  for (const char* fx : {"tiny-qwen3moe", "tiny-qwen3next"}) {
    const std::string dir = coli::test::data_dir() + "/" + fx;
    const auto& p = coli::test::goldens_of(fx)["prompts"][1];
    std::string out;
    EXPECT_EQ(coli::test::run_command(coli_run() + " --model " + dir + " --device cpu --prompt-ids " + join_ids(p["ids"], ",") +
                                          " -n 16 --temp 0 --ignore-eos 2>/dev/null", &out), 0);
    EXPECT_EQ(out, join_ids(p["greedy"], " ") + "\n") << fx;
    coli::test::TempDir d;
    const std::string cfg = coli::test::read_file(dir + "/config.json");
    std::filesystem::copy_file(dir + "/model.safetensors", d / "model.safetensors");
    auto with = [&](const std::string& from, const std::string& to) {
      std::string c = cfg;
      const std::size_t at = c.find(from);
      EXPECT_NE(at, std::string::npos) << from;
      if (at != std::string::npos) c.replace(at, from.size(), to);
      coli::test::write_file(d / "config.json", c);
    };
    const std::string experts_key = std::string(fx) == "tiny-qwen3moe" ? "\"num_local_experts\": 16" : "\"num_experts\": 16";
    const std::string key = std::string(fx) == "tiny-qwen3moe" ? "num_local_experts" : "num_experts";
    with(experts_key, "\"" + key + "\": 0");
    EXPECT_EQ(coli::test::run_command(coli_run() + " --model " + d.path() + " --prompt-ids 1 2>&1", &out), 1);
    EXPECT_NE(out.find("'" + key + "' must be a positive integer"), std::string::npos) << out;
    EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << out;
    with("\"num_experts_per_tok\": 4", "\"num_experts_per_tok\": 17");
    EXPECT_EQ(coli::test::run_command(coli_run() + " --model " + d.path() + " --prompt-ids 1 2>&1", &out), 1);
    EXPECT_NE(out.find("'num_experts_per_tok' exceeds num_experts"), std::string::npos) << out;
    EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << out;
  }
  // A missing tensor: the qwen3_next fixture without layer 0's in_proj_ba.
  coli::test::TempDir d;
  const std::string dir = coli::test::data_dir() + "/tiny-qwen3next";
  std::filesystem::copy_file(dir + "/config.json", d / "config.json");
  const coli::SafetensorsFile f(dir + "/model.safetensors");
  std::vector<coli::test::RawTensor> ts;
  for (const auto& [name, t] : f.tensors()) {
    if (name == "model.layers.0.linear_attn.in_proj_ba.weight") continue;
    ts.push_back({name, coli::dtype_name(t.dtype), t.shape, std::string(reinterpret_cast<const char*>(t.data), t.nbytes)});
  }
  coli::test::write_file(d / "model.safetensors", coli::test::safetensors_bytes(ts));
  std::string out;
  EXPECT_EQ(coli::test::run_command(coli_run() + " --model " + d.path() + " --prompt-ids 1 2>&1", &out), 1);
  EXPECT_NE(out.find("missing tensor 'model.layers.0.linear_attn.in_proj_ba.weight'"), std::string::npos) << out;
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << out;
  // An unknown family names the model_type and the ones coli runs.
  coli::test::write_file(d / "config.json", R"({"model_type":"deepseek_v3"})");
  EXPECT_EQ(coli::test::run_command(coli_run() + " --model " + d.path() + " --prompt-ids 1 2>&1", &out), 1);
  EXPECT_NE(out.find("model_type 'deepseek_v3' is not supported (coli runs qwen3_5_moe, qwen3_5_moe_text, qwen3_moe and qwen3_next)"),
            std::string::npos) << out;
}

TEST(ColiRun, DeviceFlag) {
  const auto& p = prompt(1);
  const std::string base = coli_run() + " --model " + text_model() + " --prompt-ids " + join_ids(p["ids"], ",") + " -n 16 --temp 0 --ignore-eos";
  std::string out;
  EXPECT_EQ(coli::test::run_command(base + " --device gpu 2>&1", &out), 2);
  EXPECT_NE(out.find("--device"), std::string::npos) << out;
  EXPECT_EQ(coli::test::run_command(base + " --device cpu 2>/dev/null", &out), 0);
  EXPECT_EQ(out, join_ids(p["greedy"], " ") + "\n");
  // cuda: the same tokens on a GPU; without one, exit 1 and say why.
  const int rc = coli::test::run_command(base + " --device cuda 2>&1", &out);
  if (rc == 0) {
    EXPECT_EQ(out.substr(0, out.find('\n') + 1), join_ids(p["greedy"], " ") + "\n") << out;
  } else {
    EXPECT_EQ(rc, 1);
    EXPECT_NE(out.find("CUDA backend: no usable device"), std::string::npos) << out;
    EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << out;
  }
}

namespace {
std::string qwen_tok() { return coli::test::data_dir() + "/qwen3-tokenizer"; }
const nlohmann::json& tok_goldens() {
  static const nlohmann::json g = nlohmann::json::parse(coli::test::read_file(coli::test::data_dir() + "/goldens/qwen3-tokenizer.json"));
  return g;
}
}  // namespace

TEST(ColiRun, TokenizeAndDetokenizeWithoutAModel) {
  coli::test::TempDir d;
  for (int i : {5, 120, 250}) {
    const auto& c = tok_goldens()["cases"][i];
    coli::test::write_file(d / "in.txt", c["text"].get<std::string>());
    std::string out;
    ASSERT_EQ(coli::test::run_command(coli_run() + " --tokenizer " + qwen_tok() + " --tokenize < " + d / "in.txt", &out), 0);
    EXPECT_EQ(out, join_ids(c["ids"], " ") + "\n") << c["text"];
    coli::test::write_file(d / "ids.txt", join_ids(c["ids"], " ") + "\n");
    ASSERT_EQ(coli::test::run_command(coli_run() + " --tokenizer " + qwen_tok() + " --detokenize < " + d / "ids.txt", &out), 0);
    EXPECT_EQ(out, c["decoded"].get<std::string>());
  }
}

TEST(ColiRun, TokenizeRendersChatMessages) {
  coli::test::TempDir d;
  const auto& c = tok_goldens()["chats"][3];  // system + user, generation prompt
  ASSERT_TRUE(c["add_generation_prompt"].get<bool>());
  coli::test::write_file(d / "m.json", c["messages"].dump());
  std::string out;
  ASSERT_EQ(coli::test::run_command(coli_run() + " --tokenizer " + qwen_tok() + " --tokenize --messages " + d / "m.json", &out), 0);
  EXPECT_EQ(out, join_ids(c["ids"], " ") + "\n");
}

TEST(ColiRun, ChatAndInteractiveRunEndToEnd) {
  // The tiny model with a tokenizer whose ids fit its vocabulary.
  const std::string base = coli_run() + " --model " + text_model() + " --tokenizer " + coli::test::data_dir() + "/tiny-tokenizer --temp 0 ";
  std::string once, again, err;
  ASSERT_EQ(coli::test::run_command(base + "-p 'hello world' --chat -n 12 2>/dev/null", &once), 0);
  ASSERT_EQ(coli::test::run_command(base + "-p 'hello world' --chat -n 12 2>/dev/null", &again), 0);
  EXPECT_EQ(once, again);  // greedy is deterministic
  EXPECT_FALSE(once.empty());
  // Two turns on stdin: two stats lines, and the second turn sees the first.
  ASSERT_EQ(coli::test::run_command("printf 'hi\\nhow are you\\n' | " + base + "-i -n 6 2>&1 >/dev/null", &err), 0);
  EXPECT_EQ(std::count(err.begin(), err.end(), '\n') - (err.find("no CUDA device") != std::string::npos), 2) << err;
  // Sampling with a seed is reproducible.
  const std::string s = coli_run() + " --model " + text_model() + " --tokenizer " + coli::test::data_dir() + "/tiny-tokenizer -p 'the' --temp 1 --seed 7 -n 12 2>/dev/null";
  ASSERT_EQ(coli::test::run_command(s, &once), 0);
  ASSERT_EQ(coli::test::run_command(s, &again), 0);
  EXPECT_EQ(once, again);
}

TEST(ColiConvert, ConvertRunAndUsageErrors) {
  coli::test::TempDir d;
  const std::string cc = coli::test::bin_dir() + "/coli-convert";
  std::string out;
  ASSERT_EQ(coli::test::run_command(cc + " " + text_model() + " -o " + d / "m.coli --experts int8 2>/dev/null", &out), 0);
  EXPECT_EQ(out, d / "m.coli\n");
  // The container runs like the checkpoint and gives the golden greedy tokens.
  const auto& p = prompt(2);
  ASSERT_EQ(coli::test::run_command(coli_run() + " -m " + d / "m.coli --prompt-ids " + join_ids(p["ids"], ",") + " -n 16 --temp 0 --ignore-eos 2>/dev/null", &out), 0);
  EXPECT_EQ(out, join_ids(p["greedy"], " ") + "\n");
  // verify and info.
  ASSERT_EQ(coli::test::run_command(cc + " verify " + d / "m.coli 2>/dev/null", &out), 0);
  EXPECT_EQ(out.rfind("ok\t", 0), 0u) << out;
  ASSERT_EQ(coli::test::run_command(cc + " info " + d / "m.coli", &out), 0);
  EXPECT_NE(out.find("experts\t128"), std::string::npos) << out;
  // Refuses to overwrite; bad formats and missing arguments are usage errors.
  EXPECT_EQ(coli::test::run_command(cc + " " + text_model() + " -o " + d / "m.coli 2>&1", &out), 1);
  EXPECT_NE(out.find("--force"), std::string::npos) << out;
  EXPECT_EQ(coli::test::run_command(cc + " " + text_model() + " -o " + d / "x.coli --experts int3 2>&1", &out), 2);
  EXPECT_NE(out.find("--experts"), std::string::npos) << out;
  EXPECT_EQ(coli::test::run_command(cc + " " + text_model() + " 2>&1", &out), 2);
  EXPECT_EQ(coli::test::run_command(cc + " /nonexistent -o " + d / "y.coli 2>&1", &out), 1);
  EXPECT_EQ(coli::test::run_command(cc + " verify " + d / "m.coli --fingerprint 0000000000000000 2>&1", &out), 1);
  EXPECT_NE(out.find("does not match"), std::string::npos) << out;
  EXPECT_EQ(coli::test::run_command(cc + " --help", &out), 0);
}

// coli-serve's command line: --help, usage errors (exit 2), a model or an
// address it cannot use (exit 1, one line), and a run that serves and ends
// cleanly on SIGTERM (exit 0).
TEST(ColiServe, UsageErrorsAndASigtermEndsIt) {
  const std::string serve = coli::test::bin_dir() + "/coli-serve";
  std::string out;
  EXPECT_EQ(coli::test::run_command(serve + " --help", &out), 0);
  EXPECT_NE(out.find("/v1/chat/completions"), std::string::npos);
  EXPECT_EQ(coli::test::run_command(serve + " 2>&1", &out), 2);
  EXPECT_NE(out.find("--model is required"), std::string::npos) << out;
  EXPECT_EQ(coli::test::run_command(serve + " -m x --port 70000 2>&1", &out), 2);
  EXPECT_NE(out.find("--port"), std::string::npos) << out;
  for (const char* np : {" --parallel 0", " --parallel 257", " --parallel x"}) {
    EXPECT_EQ(coli::test::run_command(serve + " -m x" + np + " 2>&1", &out), 2) << np;
    EXPECT_NE(out.find("parallel"), std::string::npos) << np << ": " << out;
  }
  const std::string model = " -m " + text_model() + " --tokenizer " + coli::test::data_dir() + "/tiny-tokenizer --device cpu";
  EXPECT_EQ(coli::test::run_command(serve + model + " --host not-an-address 2>&1", &out), 1);
  EXPECT_NE(out.find("--host not-an-address"), std::string::npos) << out;
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << out;
  EXPECT_EQ(coli::test::run_command(serve + " -m /nonexistent --device cpu 2>&1", &out), 1);
  // Serves on a free port, then SIGTERM: exit 0 with the closing line.
  coli::test::TempDir d;
  EXPECT_EQ(coli::test::run_command("(" + serve + model + " --port 0 --parallel 3 2>" + d / "err" + " & pid=$!; sleep 1; kill -TERM $pid; wait $pid)", &out), 0);
  const std::string err = coli::test::read_file(d / "err");
  EXPECT_NE(err.find("listening on http://127.0.0.1:"), std::string::npos) << err;
  EXPECT_NE(err.find("3 slots"), std::string::npos) << err;
  EXPECT_NE(err.find("SIGTERM: finishing the responses in flight"), std::string::npos) << err;
}

// The hostile-client sweep (scripts/serve-sweep.py, stdlib Python): every
// case gets its status, the server keeps answering with its greedy reply,
// every slot serves afterwards and SIGTERM ends it cleanly.
TEST(ColiServe, HostileClientsSweep) {
  std::string out;
  if (coli::test::run_command("python3 --version 2>&1", &out) != 0) GTEST_SKIP() << "no python3: " << out;
  const std::string data = coli::test::data_dir();
  const std::string script = data + "/../../scripts/serve-sweep.py";
  const int rc = coli::test::run_command("BIN=" + coli::test::bin_dir() + " python3 " + script + " --model " + data + "/tiny-qwen35moe-text --tokenizer " +
                                             data + "/tiny-tokenizer 2>&1",
                                         &out);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("0 bad"), std::string::npos) << out;
}

// A real client: the official openai npm package (tests/node, installed by
// scripts/install-deps.sh) lists the models, streams a chat, asks the same
// chat unstreamed and a completion from coli-serve with an API key; the
// greedy chat is coli-run --messages's text, streamed and not.
TEST(ColiServe, TheOpenaiNodeClientTalksToIt) {
  const std::string node_dir = std::filesystem::absolute(coli::test::data_dir() + "/../node").lexically_normal().string();
  std::string out;
  if (coli::test::run_command("node --version >/dev/null 2>&1", &out) != 0) GTEST_SKIP() << "no node on PATH (scripts/install-deps.sh installs nodejs)";
  if (!std::filesystem::exists(node_dir + "/node_modules/openai")) GTEST_SKIP() << "no openai package in tests/node (scripts/install-deps.sh: npm install there)";
  coli::test::TempDir d;
  const std::string messages = R"([{"role":"system","content":"Be brief."},{"role":"user","content":"Hello there"}])";
  coli::test::write_file(d / "messages.json", messages);
  const std::string model = " -m " + text_model() + " --tokenizer " + coli::test::data_dir() + "/tiny-tokenizer --device cpu";
  std::string want;
  ASSERT_EQ(coli::test::run_command(coli_run() + model + " --messages " + d / "messages.json" + " -n 12 --temp 0 2>/dev/null", &want), 0);
  if (!want.empty() && want.back() == '\n') want.pop_back();  // coli-run ends its text with a newline
  const std::string serve = coli::test::bin_dir() + "/coli-serve";
  const std::string cmd = "(" + serve + model + " --port 0 --api-key sekrit 2>" + d / "err" + " & pid=$!; " +
                          "for i in $(seq 100); do grep -q listening " + d / "err" + " && break; sleep 0.1; done; " +
                          "port=$(sed -n 's/.*http:\\/\\/127.0.0.1:\\([0-9]*\\).*/\\1/p' " + d / "err" + "); " +
                          "node " + node_dir + "/openai_client_check.mjs http://127.0.0.1:$port/v1 sekrit '" + messages + "'; rc=$?; " +
                          "kill -TERM $pid; wait $pid; exit $rc)";
  ASSERT_EQ(coli::test::run_command(cmd + " 2>&1", &out), 0) << out << coli::test::read_file(d / "err");
  const nlohmann::json j = nlohmann::json::parse(out.substr(out.find('{')));
  EXPECT_EQ(j["model"], "tiny-qwen35moe-text");
  EXPECT_EQ(j["streamed"], want);
  EXPECT_EQ(j["chat"], want);
  EXPECT_EQ(j["usage"], j["chat_usage"]);
  EXPECT_TRUE(j["finish"] == "stop" || j["finish"] == "length") << j.dump();
  EXPECT_TRUE(j["completion"].is_string());
}
