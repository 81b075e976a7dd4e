// Stop strings over streamed text (the API's "stop"): the text arrives in
// pieces (a token's bytes each); push() returns what may be sent now, which
// is everything that can no longer begin a stop string, and says when one
// is complete: then only the text before it is returned and the generation
// ends (OpenAI's rule: the stop string itself is not sent). flush() returns
// the held-back tail at the end of a generation that did not stop so.
// Matching is on bytes; the held-back tail is at most the longest stop
// string less one byte. Not thread-safe; one per generation.
#pragma once
#include <string>
#include <vector>

namespace coli::serve {

class StopStrings {
 public:
  explicit StopStrings(std::vector<std::string> stops);
  struct Out {
    std::string text;      // to send now
    bool stopped = false;  // a stop string completed: end the generation
  };
  Out push(const std::string& piece);
  std::string flush();

 private:
  std::vector<std::string> stops_;
  std::string held_;
  bool stopped_ = false;
};

}  // namespace coli::serve
