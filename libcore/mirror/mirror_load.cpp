#include "mirror/mirror_load.h"

#include "util/error.h"

namespace coli {

void check_mirror_flag(const std::string& mirror) {
  if (mirror == "auto" || mirror == "off") return;
  if (mirror.rfind("coli-", 0) != 0 || mirror.find('/') != std::string::npos)
    throw UsageError("--mirror: auto, off or a segment name (coli-...), not '" + mirror + "'");
}

LoadedModel load_model(const std::string& path, const std::string& mirror) {
  check_mirror_flag(mirror);
  const std::string file = container_file_of(path);
  LoadedModel out;
  if (file.empty() || mirror == "off") {
    if (file.empty() && mirror != "auto" && mirror != "off") throw Error("--mirror " + mirror + ": " + path + " is not a coli container (mirrors hold containers)");
    out.model = Model::load(path);
    return out;
  }
  auto c = std::make_shared<Container>(file);
  const std::string name = mirror == "auto" ? mirror_name(c->fingerprint()) : mirror;
  if (mirror == "auto") {
    const MirrorStatus st = mirror_status(name);
    if (st.state.empty()) out.note = "no mirror " + name;
    else if (st.state != "ready") out.note = "mirror " + name + " is " + st.state + (st.error.empty() ? "" : ": " + st.error);
    if (!st.segment) out.warning = "ignoring " + name + ": not a coli mirror (" + st.error + "); reading the container";
  }
  if (out.note.empty()) {
    try {
      out.mirror = std::make_shared<MirrorAttachment>(name, *c);
    } catch (const Error& e) {
      if (mirror != "auto") throw;
      out.note = e.what();
    }
  }
  out.model = Model::bind_container(*c, out.mirror ? mirrored_source(c, out.mirror) : std::shared_ptr<TensorSource>(c), file);
  return out;
}

}  // namespace coli
