// The tools' model/device/tier flags (tools/common/run_flags.h) read from
// an argument list as a command line gives them, for the run-options tests.
#pragma once
#include <boost/program_options.hpp>
#include <string>
#include <vector>

#include "common/run_flags.h"
#include "util/error.h"

namespace coli::test {

inline cli::RunFlags cli_flags(std::vector<std::string> args, cli::Tool tool = cli::Tool::kRun) {
  namespace po = boost::program_options;
  po::options_description opts;
  cli::add_flags(opts, tool, cli::kTierFlags);
  cli::add_flags(opts, tool, {cli::Flag::kDevice, cli::Flag::kReference, cli::Flag::kHeat});
  args.insert(args.begin(), "coli-run");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  po::variables_map vm;
  po::store(po::command_line_parser(int(argv.size()), argv.data()).options(opts).run(), vm);
  po::notify(vm);
  return cli::read_run_flags(vm, tool);
}

// The UsageError's message, or "(no usage error)".
inline std::string cli_usage_error(std::vector<std::string> args, cli::Tool tool = cli::Tool::kRun) {
  try {
    cli_flags(std::move(args), tool);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "(no usage error)";
}

}  // namespace coli::test
