#include "model/fingerprint.h"

#include <filesystem>

#include "convert/convert.h"
#include "formats/container.h"

namespace coli {

uint64_t model_fingerprint(const std::string& path) {
  namespace fs = std::filesystem;
  if (fs::is_regular_file(path)) return Container(path).fingerprint();
  if (fs::exists(fs::path(path) / "model.coli")) return Container((fs::path(path) / "model.coli").string()).fingerprint();
  return source_fingerprint(path, "checkpoint");
}

}  // namespace coli
