// The Split pre-tokenizer: a PCRE2 regex (UTF + UCP, JIT-compiled) whose
// matches and the gaps between them become the pieces BPE sees ("Isolated"
// behaviour). The patterns of HF tokenizer.json files (\p{L}, \p{N}, (?i:..),
// (?!\S)) are PCRE2 syntax as they stand.
#pragma once
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace coli {

class RegexSplitter {
 public:
  // Throws coli::Error naming `where` if the pattern does not compile.
  RegexSplitter(const std::string& pattern, const std::string& where);
  ~RegexSplitter();
  RegexSplitter(const RegexSplitter&) = delete;
  RegexSplitter& operator=(const RegexSplitter&) = delete;

  // Calls fn(piece) for each match and each non-empty gap, in order. `text`
  // must be valid UTF-8.
  template <class Fn>
  void split(std::string_view text, Fn&& fn) const {
    MatchData md;
    std::size_t pos = 0;
    while (pos < text.size()) {
      std::size_t b, e;
      if (!next_match(md, text, pos, &b, &e)) break;
      if (b > pos) fn(text.substr(pos, b - pos));
      fn(text.substr(b, e - b));
      pos = e;
    }
    if (pos < text.size()) fn(text.substr(pos));
  }

 private:
  // Owns PCRE2 match data for one split() call.
  struct MatchData {
    MatchData();
    ~MatchData();
    MatchData(const MatchData&) = delete;
    MatchData& operator=(const MatchData&) = delete;
    void* p;
  };
  // First match at or after pos, non-empty; false if none.
  bool next_match(MatchData& md, std::string_view text, std::size_t pos, std::size_t* b, std::size_t* e) const;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The pattern GPT-2's ByteLevel pre-tokenizer uses when use_regex is true.
extern const char* const kGpt2SplitPattern;

}  // namespace coli
