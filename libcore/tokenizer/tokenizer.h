// Tokenizer: a Hugging Face tokenizer.json with a byte-level BPE model.
//
// encode(): added tokens (special or not) are matched first, leftmost-longest;
// the text between them is NFC-normalised (when the file says so), split by
// the pre-tokenizer regex, and each piece is byte-level BPE encoded.
// decode(): token bytes concatenated, ill-formed UTF-8 replaced by U+FFFD.
// Loading validates the file: unknown model, normalizer or pre-tokenizer
// types, ids out of range and merges of unknown tokens are coli::Errors that
// name the file and the field.
#pragma once
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/bpe.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/word_cache.h"

namespace coli {

class Tokenizer {
 public:
  // PATH is a tokenizer.json file or a directory holding one (and, if
  // present, tokenizer_config.json with the chat template and eos token).
  static std::unique_ptr<Tokenizer> load(const std::string& path);
  // From file contents; `where` names the file in errors. config_json may be empty.
  static std::unique_ptr<Tokenizer> from_json(std::string_view tokenizer_json, std::string_view config_json, const std::string& where);
  ~Tokenizer();

  std::vector<int> encode(std::string_view text) const;
  std::string decode(std::span<const int> ids, bool skip_special = false) const;
  // Raw bytes of one token (an added token's content as written).
  const std::string& token_bytes(int id) const;

  int vocab_size() const { return static_cast<int>(id_bytes_.size()); }
  bool is_special(int id) const;
  // Id of a token spelled exactly `content` (added token or vocabulary string).
  std::optional<int> find(std::string_view content) const;
  const std::string& chat_template() const { return chat_template_; }
  const std::string& eos_token() const { return eos_token_; }
  // Empties this thread's word cache (benchmarks of cold encoding).
  void clear_cache() const;

 private:
  Tokenizer();
  WordCache& thread_cache() const;
  uint64_t serial_ = 0;
  struct Added {
    std::string content;
    int id;
    bool special;
  };
  // Encodes text that holds no added token.
  void encode_plain(std::string_view text, std::vector<int>& out) const;

  Bpe bpe_;
  std::unique_ptr<RegexSplitter> splitter_;
  bool nfc_ = false;
  std::vector<std::string> id_bytes_;  // by id; empty for unused ids
  std::vector<char> special_;          // by id
  std::vector<Added> added_;
  std::vector<std::vector<int>> added_by_byte_;  // first byte -> indices into added_, longest first
  std::vector<std::pair<std::string, int>> vocab_sorted_;  // for find()
  std::string chat_template_, eos_token_;
};

// Throws coli::Error when `tok` has ids past the model's vocabulary (the
// tokenizer of another model), naming both paths and both sizes. Models may
// pad their vocabulary past the tokenizer's, so fewer ids is fine.
void check_tokenizer_matches(const Tokenizer& tok, const std::string& tokenizer_path, int model_vocab_size, const std::string& model_path);

}  // namespace coli
