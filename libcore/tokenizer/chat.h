// Chat prompts in the ChatML form of the Qwen chat templates.
//
// render_chat() produces what the Qwen3 family's Jinja chat_template renders
// for plain-text conversations (system / user / assistant / tool messages):
// the system turn first, assistant "<think>" reasoning kept only after the
// last user query, the generation prompt, and an empty think block when
// thinking is turned off. It does not interpret arbitrary Jinja; a template
// that is not ChatML is refused by chat_style_of().
#pragma once
#include <optional>
#include <string>
#include <vector>

namespace coli {

struct ChatMessage {
  std::string role;  // system, user, assistant, tool
  std::string content;
  std::optional<std::string> reasoning_content;  // assistant only
};

struct ChatOptions {
  bool add_generation_prompt = true;
  std::optional<bool> enable_thinking;  // unset: the template's default
};

struct ChatStyle {
  // The generation prompt opens "<think>\n" unless thinking is disabled
  // (templates that think by default); Qwen3's leaves it to the model.
  bool opens_think = false;
};

// Recognises a Qwen ChatML template; throws coli::Error for others.
ChatStyle chat_style_of(const std::string& chat_template);

std::string render_chat(const std::vector<ChatMessage>& messages, const ChatOptions& opt, const ChatStyle& style = {});

// Parses an OpenAI-style JSON list of {"role", "content"} (content a string,
// or a list of {"type": "text", "text": ...} parts). `where` names the file.
std::vector<ChatMessage> parse_chat_messages(const std::string& json_text, const std::string& where);

}  // namespace coli
