#include "util/build_info.h"

#include <sys/resource.h>

#include <fstream>
#include <thread>

#ifndef COLI_BUILD_COMMIT
#define COLI_BUILD_COMMIT "unknown"
#endif

namespace coli {

std::string build_commit() { return COLI_BUILD_COMMIT; }

std::string cpu_info() {
  std::ifstream in("/proc/cpuinfo");
  std::string line, name = "unknown CPU";
  while (std::getline(in, line))
    if (line.rfind("model name", 0) == 0) {
      name = line.substr(line.find(':') + 2);
      break;
    }
  return name + ", " + std::to_string(std::thread::hardware_concurrency()) + " threads";
}

double peak_rss_mb() {
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_maxrss / 1024.0;
}

}  // namespace coli
