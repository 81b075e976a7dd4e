// coli-convert: Hugging Face checkpoint -> coli container; synthetic
// checkpoints; container checks. Thin: parses flags, calls libcore.
#include <boost/program_options.hpp>
#include <cstdio>
#include <filesystem>
#include <iostream>

#include "convert/convert.h"
#include "cpu_backend.h"
#include "engine/engine.h"
#include "env_options.h"
#include "eval/compare.h"
#include "model/weights.h"
#include "convert/synth.h"
#include "formats/container.h"
#include "parse_options.h"
#include "util/error.h"
#include "util/parse.h"
#include "util/tool_main.h"
#include "util/progress.h"

namespace po = boost::program_options;

namespace {

const char* kUsage =
    "usage: coli-convert SRC_DIR -o OUT.coli [--experts FMT] [--down FMT] [--trunk FMT] ... [--force]\n"
    "       coli-convert synth -o DIR [--family F] [--layers N] [--mtp] [--seed S] [--routing-skew X] [--tokenizer DIR] [--force]\n"
    "       coli-convert synth -o OUT.coli [--container] [--experts FMT] ... [--layers N] [--seed S] ... [--force]\n"
    "       coli-convert verify FILE.coli [--fingerprint HEX]\n"
    "       coli-convert info FILE.coli\n"
    "       coli-convert compare REFERENCE MODEL [--sequences N] [--length L] [--seed S]\n"
    "       coli-convert formats\n"
    "\n"
    "Converts a Hugging Face qwen3_5_moe checkpoint (bf16, f16, f32 or block-scaled\n"
    "fp8) into a coli container with one 4 KiB-aligned blob per routed expert.\n";

coli::QuantFormat fmt(const po::variables_map& vm, const char* key, coli::QuantFormat def) {
  if (!vm.count(key)) return def;
  coli::QuantFormat f;
  const std::string s = vm[key].as<std::string>();
  if (!coli::parse_format(s, &f) || f == coli::QuantFormat::FP8_E4M3_B128)
    throw coli::UsageError(std::string("--") + key + ": unknown format '" + s + "' (one of " + coli::container_format_names() + ")");
  return f;
}

// The container format options, shared by convert and synth.
po::options_description format_options() {
  po::options_description opts("container formats");
  opts.add_options()("experts", po::value<std::string>(), "routed experts' gate and up (default int4-g64)")
      ("down", po::value<std::string>(), "routed experts' down (default: as --experts)")
      ("shared", po::value<std::string>(), "shared expert (default: as --trunk)")
      ("trunk", po::value<std::string>(), "attention and DeltaNet projections (default int8)")
      ("router", po::value<std::string>(), "router (default bf16)")
      ("lm-head", po::value<std::string>(), "output projection (default int8)")
      ("embed", po::value<std::string>(), "token embeddings (default bf16)")
      ("no-verify", po::bool_switch(), "skip re-reading the written container");
  return opts;
}

void read_formats(const po::variables_map& vm, coli::ConvertOptions* o) {
  o->experts = fmt(vm, "experts", o->experts);
  o->down = fmt(vm, "down", o->experts);
  o->trunk = fmt(vm, "trunk", o->trunk);
  o->shared = fmt(vm, "shared", o->trunk);
  o->router = fmt(vm, "router", o->router);
  o->lm_head = fmt(vm, "lm-head", o->lm_head);
  o->embed = fmt(vm, "embed", o->embed);
  o->verify = !vm["no-verify"].as<bool>();
}

void print_convert_stats(const char* tool, const coli::ConvertReport& r, const coli::ConvertOptions& o) {
  std::printf("%s\n", r.out.c_str());
  std::fprintf(stderr, "%s: %s: %.2f GB -> %.2f GB, %zu blobs, fingerprint %s, %.1f s convert, %.1f s verify (%s)\n", tool, r.out.c_str(),
               r.bytes_in / 1e9, r.bytes_out / 1e9, r.blobs, coli::hex64(r.fingerprint).c_str(), r.seconds, r.verify_seconds,
               o.settings_string().c_str());
}

int cmd_convert(int argc, char** argv) {
  po::options_description opts("convert options");
  opts.add_options()("help,h", "show this help")("source", po::value<std::string>(), "checkpoint directory")
      ("output,o", po::value<std::string>(), "output container file (or directory: DIR/model.coli)")
      ("threads,t", po::value<int>()->default_value(0), "worker threads (0: all cores)")
      ("force", po::bool_switch(), "overwrite an existing output");
  opts.add(format_options());
  po::positional_options_description pos;
  pos.add("source", 1);
  auto vm = coli::parse_options(argc, argv, opts, pos);
  if (vm.count("help")) {
    std::cout << kUsage << "\n" << opts << "\nformats: " << coli::container_format_names() << std::endl;
    return 0;
  }
  if (!vm.count("source")) throw coli::UsageError("give the checkpoint directory");
  if (!vm.count("output")) throw coli::UsageError("-o OUT is required");
  coli::ConvertOptions o;
  read_formats(vm, &o);
  o.threads = coli::check_thread_count(vm["threads"].as<int>(), "-t/--threads");
  o.overwrite = vm["force"].as<bool>();
  o.progress = coli::stderr_is_tty();
  auto r = coli::convert_checkpoint(vm["source"].as<std::string>(), vm["output"].as<std::string>(), o);
  print_convert_stats("coli-convert", r, o);
  return 0;
}

int cmd_synth(int argc, char** argv) {
  po::options_description opts("synth options");
  opts.add_options()("help,h", "show this help")("output,o", po::value<std::string>(), "output checkpoint directory, or container (a name ending in .coli, or --container)")
      ("container", po::bool_switch(), "write a coli container (as synth then convert would), not a checkpoint")
      ("family", po::value<std::string>()->default_value("qwen3_5_moe"), "model family at its released shapes: qwen3_5_moe (Qwen3.6-35B-A3B), qwen3_moe (Qwen3-30B-A3B) or qwen3_next (Qwen3-Next-80B-A3B)")
      ("layers", po::value<int>()->default_value(8), "number of layers (every 4th is full attention; qwen3_moe: all)")
      ("mtp", po::bool_switch(), "with the multi-token-prediction module of the released checkpoints (mtp.*: one more layer; not qwen3_moe)")
      ("seed", po::value<std::string>()->default_value("0"), "random seed")
      ("routing-skew", po::value<double>()->default_value(0.0), "Zipf exponent of expert popularity per layer (0: unbiased)")
      ("tokenizer", po::value<std::string>(), "copy tokenizer.json and tokenizer_config.json from this directory")
      ("threads,t", po::value<int>()->default_value(0), "worker threads (0: all cores)")
      ("force", po::bool_switch(), "overwrite an existing output");
  po::options_description formats = format_options();
  opts.add(formats);
  auto vm = coli::parse_options(argc, argv, opts, {});
  if (vm.count("help")) {
    std::cout << kUsage << "\n" << opts << "\nformats: " << coli::container_format_names() << "\n"
              << "\nWith a container output the bf16 checkpoint is never written: each tensor is\n"
                 "generated and quantized in memory, and the container is byte for byte the one\n"
                 "'synth -o DIR' then 'coli-convert DIR -o OUT.coli' with the same options gives.\n";
    return 0;
  }
  if (!vm.count("output")) throw coli::UsageError("-o DIR (or -o OUT.coli) is required");
  const std::string out = vm["output"].as<std::string>();
  // A .coli name is a container: a checkpoint directory by that name would
  // only be a surprise.
  const bool container = vm["container"].as<bool>() || std::filesystem::path(out).extension() == ".coli";
  if (!container)
    for (const auto& f : formats.options())
      if (vm.count(f->long_name()) && !vm[f->long_name()].defaulted())
        throw coli::UsageError("--" + f->long_name() + " applies to a container: name the output OUT.coli or add --container");
  coli::SynthOptions o;
  const std::string fam = vm["family"].as<std::string>();
  if (fam == "qwen3_5_moe") o = coli::synth_shapes(o, coli::ModelFamily::kQwen35Moe);
  else if (fam == "qwen3_moe") o = coli::synth_shapes(o, coli::ModelFamily::kQwen3Moe);
  else if (fam == "qwen3_next") o = coli::synth_shapes(o, coli::ModelFamily::kQwen3Next);
  else throw coli::UsageError("--family " + fam + ": expected qwen3_5_moe, qwen3_moe or qwen3_next");
  o.layers = vm["layers"].as<int>();
  if (o.layers < 1) throw coli::UsageError("--layers must be at least 1");
  o.mtp = vm["mtp"].as<bool>();
  if (o.mtp && o.family == coli::ModelFamily::kQwen3Moe) throw coli::UsageError("--mtp: qwen3_moe checkpoints have no MTP module");
  o.seed = coli::parse_seed(vm["seed"].as<std::string>(), "--seed");
  o.routing_skew = vm["routing-skew"].as<double>();
  if (o.routing_skew < 0) throw coli::UsageError("--routing-skew must be >= 0");
  if (vm.count("tokenizer")) o.tokenizer_dir = vm["tokenizer"].as<std::string>();
  o.threads = coli::check_thread_count(vm["threads"].as<int>(), "-t/--threads");
  o.overwrite = vm["force"].as<bool>();
  o.progress = coli::stderr_is_tty();
  if (container) {
    coli::ConvertOptions co;
    read_formats(vm, &co);
    co.threads = o.threads;
    co.overwrite = o.overwrite;
    co.progress = o.progress;
    auto r = coli::write_synthetic_container(out, o, co);
    print_convert_stats("coli-convert synth", r, co);
    return 0;
  }
  auto r = coli::write_synthetic_checkpoint(out, o);
  std::printf("%s\n", out.c_str());
  std::fprintf(stderr, "coli-convert synth: %d layers, %.2f B parameters, %.2f GB in %d shards, %.1f s\n", o.layers, r.params / 1e9, r.bytes / 1e9,
               r.shards, r.seconds);
  return 0;
}

int cmd_verify(int argc, char** argv, bool info) {
  po::options_description opts(info ? "info options" : "verify options");
  opts.add_options()("help,h", "show this help")("file", po::value<std::string>(), "container")
      ("fingerprint", po::value<std::string>(), "expected fingerprint (16 hex digits)");
  po::positional_options_description pos;
  pos.add("file", 1);
  auto vm = coli::parse_options(argc, argv, opts, pos);
  if (vm.count("help")) {
    std::cout << kUsage << "\n" << opts << std::endl;
    return 0;
  }
  if (!vm.count("file")) throw coli::UsageError("give the container file");
  std::optional<uint64_t> want;
  if (vm.count("fingerprint")) {
    const std::string h = vm["fingerprint"].as<std::string>();
    char* end = nullptr;
    want = std::strtoull(h.c_str(), &end, 16);
    if (h.size() != 16 || *end) throw coli::UsageError("--fingerprint takes 16 hex digits");
  }
  coli::Container c(vm["file"].as<std::string>(), want);
  const auto& m = c.manifest();
  if (info) {
    std::size_t experts = 0, tensors = 0, files = 0;
    uint64_t expert_bytes = 0;
    for (const auto& b : m.blobs) {
      experts += b.kind == "expert";
      tensors += b.kind == "tensor";
      files += b.kind == "file";
      if (b.kind == "expert") expert_bytes += b.bytes;
    }
    std::printf("fingerprint\t%s\nversion\t%u\ntensors\t%zu\nexperts\t%zu\nexpert_blob_bytes\t%llu\nfiles\t%zu\nsettings\t%s\n", coli::hex64(m.fingerprint).c_str(),
                m.version, tensors, experts, static_cast<unsigned long long>(experts ? expert_bytes / experts : 0), files, m.settings.dump().c_str());
    return 0;
  }
  coli::Progress bar("verify", 1, coli::stderr_is_tty());
  c.verify_checksums();
  bar.add(1);
  bar.finish();
  std::printf("ok\t%s\t%s\n", vm["file"].as<std::string>().c_str(), coli::hex64(m.fingerprint).c_str());
  return 0;
}

int cmd_compare(int argc, char** argv) {
  po::options_description opts("compare options");
  opts.add_options()("help,h", "show this help")("reference", po::value<std::string>(), "unquantized model (checkpoint or container)")
      ("model", po::value<std::string>(), "model to measure")
      ("sequences", po::value<int>()->default_value(8), "random token sequences")
      ("length", po::value<int>()->default_value(64), "tokens per sequence")
      ("seed", po::value<std::string>()->default_value("0"), "seed of the sequences");
  po::positional_options_description pos;
  pos.add("reference", 1).add("model", 1);
  auto vm = coli::parse_options(argc, argv, opts, pos);
  if (vm.count("help")) {
    std::cout << kUsage << "\n" << opts << std::endl;
    return 0;
  }
  if (!vm.count("reference") || !vm.count("model")) throw coli::UsageError("give REFERENCE and MODEL");
  if (vm["sequences"].as<int>() < 1 || vm["length"].as<int>() < 1) throw coli::UsageError("--sequences and --length must be at least 1");
  auto ref = coli::Model::load(vm["reference"].as<std::string>());
  auto model = coli::Model::load(vm["model"].as<std::string>());
  coli::cpu::CpuBackend ba(*ref), bb(*model);
  coli::Engine ea(ref->spec(), ba), eb(model->spec(), bb);
  auto seqs = coli::random_sequences(vm["sequences"].as<int>(), vm["length"].as<int>(), ref->spec().vocab_size, coli::parse_seed(vm["seed"].as<std::string>(), "--seed"));
  auto r = coli::compare_outputs(ea, eb, seqs);
  r.weights_rel_rmse = coli::weights_rel_rmse(*ref, *model);
  std::printf("positions\tmean_kl\tmax_kl\ttop1_agree\tmax_abs_logit\tweights_rel_rmse\n%d\t%.3g\t%.3g\t%.4f\t%.3g\t%.4f\n", r.positions, r.mean_kl, r.max_kl,
              r.top1_agree, r.max_abs_logit, r.weights_rel_rmse);
  return 0;
}

int cmd_formats() {
  std::printf("format\tbits_per_weight\trel_rmse_gaussian\n");
  for (int i = 0; i < static_cast<int>(coli::QuantFormat::FP8_E4M3_B128); ++i) {
    const auto f = static_cast<coli::QuantFormat>(i);
    double bpw = 0;
    const double e = coli::format_rel_rmse(f, 1024, &bpw);
    std::printf("%s\t%.3f\t%.5f\n", coli::format_name(f), bpw, e);
  }
  return 0;
}

int run(int argc, char** argv) {
  coli::apply_environment();  // COLI_CPU_LEVEL for compare's CPU backends (env_options.h)
  if (argc < 2) throw coli::UsageError("nothing to do");
  const std::string cmd = argv[1];
  if (cmd == "synth") return cmd_synth(argc - 1, argv + 1);
  if (cmd == "verify") return cmd_verify(argc - 1, argv + 1, false);
  if (cmd == "info") return cmd_verify(argc - 1, argv + 1, true);
  if (cmd == "convert") return cmd_convert(argc - 1, argv + 1);
  if (cmd == "compare") return cmd_compare(argc - 1, argv + 1);
  if (cmd == "formats") return cmd_formats();
  if (cmd == "-h" || cmd == "--help") {
    std::cout << kUsage << "\nRun 'coli-convert SUBCOMMAND --help' for the options of each; 'convert' is the default.\n";
    return 0;
  }
  // Anything else is convert's SRC_DIR (or an option): a word that names
  // neither a subcommand nor a file, and is not a path, is most likely a
  // mistyped subcommand.
  std::error_code ec;
  if (cmd[0] != '-' && cmd.find('/') == std::string::npos && !std::filesystem::exists(cmd, ec))
    throw coli::UsageError("'" + cmd + "' is neither a subcommand (convert, synth, verify, info, compare, formats) nor a checkpoint directory");
  return cmd_convert(argc, argv);
}

}  // namespace

int main(int argc, char** argv) { return coli::tool_main("coli-convert", [&] { return run(argc, argv); }); }
