#include "serve/stop_strings.h"

#include <algorithm>

namespace coli::serve {

StopStrings::StopStrings(std::vector<std::string> stops) : stops_(std::move(stops)) {
  stops_.erase(std::remove(stops_.begin(), stops_.end(), std::string()), stops_.end());
}

StopStrings::Out StopStrings::push(const std::string& piece) {
  Out out;
  if (stopped_) {
    out.stopped = true;
    return out;
  }
  std::string buf = held_ + piece;
  held_.clear();
  // The earliest complete stop string ends the text there.
  std::size_t first = std::string::npos;
  for (const std::string& s : stops_) first = std::min(first, buf.find(s));
  if (first != std::string::npos) {
    stopped_ = out.stopped = true;
    out.text = buf.substr(0, first);
    return out;
  }
  // Hold back the longest tail that begins some stop string.
  std::size_t hold = 0;
  for (const std::string& s : stops_)
    for (std::size_t n = std::min(s.size() - 1, buf.size()); n > hold; --n)
      if (buf.compare(buf.size() - n, n, s, 0, n) == 0) {
        hold = n;
        break;
      }
  held_ = buf.substr(buf.size() - hold);
  out.text = buf.substr(0, buf.size() - hold);
  return out;
}

std::string StopStrings::flush() {
  std::string t;
  if (!stopped_) t.swap(held_);
  return t;
}

}  // namespace coli::serve
