#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/pretokenizer.h"

#include <pcre2.h>


#include "util/error.h"

namespace coli {

const char* const kGpt2SplitPattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

struct RegexSplitter::Impl {
  pcre2_code* code = nullptr;
  bool jit = false;
};

// One ovector pair is enough: only the whole match (group 0) is used.
RegexSplitter::MatchData::MatchData() : p(pcre2_match_data_create(1, nullptr)) {
  if (!p) throw Error("out of memory for regex match data");
}
RegexSplitter::MatchData::~MatchData() { pcre2_match_data_free(static_cast<pcre2_match_data*>(p)); }

RegexSplitter::RegexSplitter(const std::string& pattern, const std::string& where) : impl_(std::make_unique<Impl>()) {
  int err = 0;
  PCRE2_SIZE off = 0;
  impl_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), PCRE2_UTF | PCRE2_UCP, &err, &off, nullptr);
  if (!impl_->code) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    throw Error(where + ": regex does not compile at offset " + std::to_string(off) + ": " + reinterpret_cast<char*>(msg));
  }
  impl_->jit = pcre2_jit_compile(impl_->code, PCRE2_JIT_COMPLETE) == 0;
}

RegexSplitter::~RegexSplitter() {
  if (impl_ && impl_->code) pcre2_code_free(impl_->code);
}

bool RegexSplitter::next_match(MatchData& mdata, std::string_view text, std::size_t pos, std::size_t* b, std::size_t* e) const {
  auto* md = static_cast<pcre2_match_data*>(mdata.p);
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  while (pos < text.size()) {
    const int rc = impl_->jit ? pcre2_jit_match(impl_->code, subject, text.size(), pos, PCRE2_NO_UTF_CHECK, md, nullptr)
                              : pcre2_match(impl_->code, subject, text.size(), pos, PCRE2_NO_UTF_CHECK, md, nullptr);
    if (rc < 0) return false;
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    if (ov[1] > ov[0]) {
      *b = ov[0];
      *e = ov[1];
      return true;
    }
    // Empty match: retry one character further.
    pos = ov[0] + 1;
    while (pos < text.size() && (static_cast<unsigned char>(text[pos]) & 0xC0) == 0x80) ++pos;
  }
  return false;
}

}  // namespace coli
