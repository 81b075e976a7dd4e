// coli-run: generate from a model. Thin: parses flags, calls libcore.
#include <boost/program_options.hpp>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cpu_backend.h"
#include "cuda_device.h"
#include "engine/engine.h"
#include "engine/generate.h"
#include "model/weights.h"
#include "util/error.h"
#include "util/parse.h"

namespace po = boost::program_options;

namespace {

const char* kUsage =
    "usage: coli-run --model DIR --prompt-ids 7,8,9 [-n 16] [--temp 0] [--json [--top-logprobs K]]\n"
    "\n"
    "Generates tokens from a Hugging Face qwen3_5_moe checkpoint directory.\n"
    "Generated ids go to stdout on one line (or one JSON object per token with\n"
    "--json); a stats line goes to stderr.\n";

int run(int argc, char** argv) {
  po::options_description opts("options");
  opts.add_options()
      ("help,h", "show this help and exit")
      ("model,m", po::value<std::string>(), "checkpoint directory (config.json + safetensors)")
      ("prompt-ids", po::value<std::string>(), "prompt as comma-separated token ids")
      ("n-predict,n", po::value<int>()->default_value(16), "number of tokens to generate")
      ("temp", po::value<float>()->default_value(0.0f), "sampling temperature; 0 = greedy")
      ("seed", po::value<uint64_t>()->default_value(0), "random seed for sampling")
      ("json", po::bool_switch(), "one JSON object per generated token")
      ("top-logprobs", po::value<int>()->default_value(0), "with --json: the K most likely ids and their logprobs")
      ("ignore-eos", po::bool_switch(), "do not stop at end-of-sequence ids")
      ("prefill-chunk", po::value<int>()->default_value(512), "prompt tokens per forward chunk");
  po::variables_map vm;
  try {
    po::store(po::command_line_parser(argc, argv).options(opts).run(), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    throw coli::UsageError(e.what());
  }
  if (vm.count("help")) {
    std::cout << kUsage << "\n" << opts << std::endl;
    return 0;
  }
  if (!vm.count("model")) throw coli::UsageError("--model is required");
  if (!vm.count("prompt-ids")) throw coli::UsageError("--prompt-ids is required (text prompts need a tokenizer: not yet supported)");
  const int n = vm["n-predict"].as<int>();
  if (n < 1) throw coli::UsageError("--n-predict must be at least 1");
  const int topk = vm["top-logprobs"].as<int>();
  if (topk < 0) throw coli::UsageError("--top-logprobs must be >= 0");
  if (vm["prefill-chunk"].as<int>() < 1) throw coli::UsageError("--prefill-chunk must be at least 1");
  if (vm["temp"].as<float>() < 0) throw coli::UsageError("--temp must be >= 0");
  const std::vector<int> prompt = coli::parse_id_list(vm["prompt-ids"].as<std::string>(), "--prompt-ids");

  auto model = coli::Model::load(vm["model"].as<std::string>());
  // The CUDA backend is not there yet; a CUDA build says once what it uses.
  std::string why;
  if (coli::cuda::compiled_with_cuda() && coli::cuda::device_count(&why) == 0)
    std::fprintf(stderr, "coli-run: no CUDA device (%s); running on the CPU\n", why.c_str());
  coli::cpu::CpuBackend backend(*model);
  coli::Engine engine(model->spec(), backend, vm["prefill-chunk"].as<int>());
  coli::Session session = engine.new_session();

  coli::GenerateOptions go;
  go.n_predict = n;
  go.temperature = vm["temp"].as<float>();
  go.seed = vm["seed"].as<uint64_t>();
  go.top_logprobs = topk;
  go.ignore_eos = vm["ignore-eos"].as<bool>();
  const bool json = vm["json"].as<bool>();
  bool first = true;
  auto st = coli::generate(engine, session, prompt, go, [&](const coli::TokenEvent& ev) {
    if (json) {
      nlohmann::json j = {{"id", ev.id}, {"logprob", ev.logprob}};
      if (topk > 0) {
        j["top_logprobs"] = nlohmann::json::array();
        for (auto [id, lp] : ev.top) j["top_logprobs"].push_back({{"id", id}, {"logprob", lp}});
      }
      std::printf("%s\n", j.dump().c_str());
    } else {
      std::printf(first ? "%d" : " %d", ev.id);
    }
    first = false;
    std::fflush(stdout);
  });
  if (!json) std::printf("\n");
  std::fflush(stdout);
  std::fprintf(stderr, "coli-run: backend %s, prompt %d tokens, prefill %.1f tok/s, decode %.1f tok/s (%d tokens)\n",
               backend.name().c_str(), st.n_prompt, st.n_prompt / std::max(st.prefill_seconds, 1e-9),
               st.n_decode_steps ? st.n_decode_steps / std::max(st.decode_seconds, 1e-9) : 0.0, st.n_generated);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const coli::UsageError& e) {
    std::fprintf(stderr, "coli-run: %s (see --help)\n", e.what());
    return 2;
  } catch (const coli::Error& e) {
    std::fprintf(stderr, "coli-run: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "coli-run: internal error: %s\n", e.what());
    return 1;
  }
}
