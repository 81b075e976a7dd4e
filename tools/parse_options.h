// Boost.Program_options for the subcommand tools (coli-convert, coli-pin):
// parses argv against opts and positional names; a bad command line is a
// coli::UsageError (exit 2), with Boost's message.
#pragma once
#include <boost/program_options.hpp>

#include "util/error.h"

namespace coli {

inline boost::program_options::variables_map parse_options(int argc, char** argv, const boost::program_options::options_description& opts,
                                                           const boost::program_options::positional_options_description& pos) {
  namespace po = boost::program_options;
  po::variables_map vm;
  try {
    po::store(po::command_line_parser(argc, argv).options(opts).positional(pos).run(), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    throw UsageError(e.what());
  }
  return vm;
}

}  // namespace coli
