// ChatSession: a conversation with the model. It keeps the messages,
// renders them with the chat template for every turn, and feeds the model
// only what extends the ids already in its state (the whole prompt again
// when the rendering changed earlier text, e.g. dropped reasoning).
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "engine/generate.h"
#include "tokenizer/chat.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace coli {

// Ids that end a turn: the tokenizer's eos token, <|im_end|> and
// <|endoftext|> where the vocabulary has them.
std::vector<int> tokenizer_stop_ids(const Tokenizer& tok);

// Token ids -> printable text, streamed: special tokens print nothing, and a
// character split across tokens is held back until it is complete. Ids the
// tokenizer lacks (models pad their vocabulary past the tokenizer's) print
// nothing either.
class TextStreamer {
 public:
  explicit TextStreamer(const Tokenizer& tok) : tok_(tok) {}
  std::string push(int id) {
    if (id < 0 || id >= tok_.vocab_size() || tok_.is_special(id)) return {};
    return utf8_.push(tok_.token_bytes(id));
  }
  std::string flush() { return utf8_.flush(); }

 private:
  const Tokenizer& tok_;
  Utf8Stream utf8_;
};

class ChatSession {
 public:
  ChatSession(Engine& engine, const Tokenizer& tok, GenerateOptions gen, ChatOptions chat);

  std::vector<ChatMessage>& messages() { return messages_; }
  // Renders the messages, generates the assistant's reply (streamed through
  // on_text), and appends it to the messages.
  GenerateStats respond(const std::function<void(const std::string&)>& on_text);

 private:
  Engine& engine_;
  const Tokenizer& tok_;
  GenerateOptions gen_;
  ChatOptions chat_;
  ChatStyle style_;
  Session session_;
  std::vector<int> fed_;  // ids in session_'s state
  std::vector<ChatMessage> messages_;
};

}  // namespace coli
