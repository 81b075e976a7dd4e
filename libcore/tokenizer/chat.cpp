#include "tokenizer/chat.h"

#include <nlohmann/json.hpp>

#include "util/error.h"

namespace coli {

namespace {

bool starts_with(const std::string& s, const std::string& p) { return s.compare(0, p.size(), p) == 0; }
bool ends_with(const std::string& s, const std::string& p) { return s.size() >= p.size() && s.compare(s.size() - p.size(), p.size(), p) == 0; }

std::string lstrip_nl(const std::string& s) {
  const auto b = s.find_first_not_of('\n');
  return b == std::string::npos ? "" : s.substr(b);
}
std::string rstrip_nl(const std::string& s) {
  const auto e = s.find_last_not_of('\n');
  return e == std::string::npos ? "" : s.substr(0, e + 1);
}
std::string strip_nl(const std::string& s) { return rstrip_nl(lstrip_nl(s)); }

// Python's s.split(sep)[-1] and s.split(sep)[0].
std::string after_last(const std::string& s, const std::string& sep) {
  const auto p = s.rfind(sep);
  return p == std::string::npos ? s : s.substr(p + sep.size());
}
std::string before_first(const std::string& s, const std::string& sep) {
  const auto p = s.find(sep);
  return p == std::string::npos ? s : s.substr(0, p);
}

}  // namespace

ChatStyle chat_style_of(const std::string& tpl) {
  if (tpl.find("<|im_start|>") == std::string::npos || tpl.find("<|im_end|>") == std::string::npos)
    throw Error("chat template: not a ChatML (<|im_start|> ... <|im_end|>) template; only the Qwen templates are supported");
  ChatStyle st;
  // Templates that think by default append "<think>\n" to the generation
  // prompt in an else branch of the enable_thinking test.
  const auto gen = tpl.rfind("add_generation_prompt");
  if (gen != std::string::npos) {
    const std::string tail = tpl.substr(gen);
    st.opens_think = tail.find("'<think>\\n' }}") != std::string::npos || tail.find("\"<think>\\n\" }}") != std::string::npos;
  }
  return st;
}

std::string render_chat(const std::vector<ChatMessage>& msgs, const ChatOptions& opt, const ChatStyle& style) {
  if (msgs.empty()) throw Error("chat: no messages");
  const int n = static_cast<int>(msgs.size());
  std::string out;
  if (msgs[0].role == "system") out += "<|im_start|>system\n" + msgs[0].content + "<|im_end|>\n";

  // The last user query that is not a tool response: assistant reasoning
  // before it is dropped from the history.
  int last_query = n - 1;
  for (int i = n - 1; i >= 0; --i) {
    const auto& m = msgs[i];
    if (m.role == "user" && !(starts_with(m.content, "<tool_response>") && ends_with(m.content, "</tool_response>"))) {
      last_query = i;
      break;
    }
  }
  for (int i = 0; i < n; ++i) {
    const auto& m = msgs[i];
    if (m.role == "user" || (m.role == "system" && i != 0)) {
      out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
    } else if (m.role == "system") {
      continue;  // rendered above
    } else if (m.role == "assistant") {
      std::string content = m.content, reasoning;
      if (m.reasoning_content) {
        reasoning = *m.reasoning_content;
      } else if (content.find("</think>") != std::string::npos) {
        reasoning = lstrip_nl(after_last(rstrip_nl(before_first(m.content, "</think>")), "<think>"));
        content = lstrip_nl(after_last(m.content, "</think>"));
      }
      if (i > last_query && (i == n - 1 || !reasoning.empty()))
        out += "<|im_start|>assistant\n<think>\n" + strip_nl(reasoning) + "\n</think>\n\n" + lstrip_nl(content);
      else
        out += "<|im_start|>assistant\n" + content;
      out += "<|im_end|>\n";
    } else if (m.role == "tool") {
      if (i == 0 || msgs[i - 1].role != "tool") out += "<|im_start|>user";
      out += "\n<tool_response>\n" + m.content + "\n</tool_response>";
      if (i == n - 1 || msgs[i + 1].role != "tool") out += "<|im_end|>\n";
    } else {
      throw Error("chat: message " + std::to_string(i) + " has unknown role '" + m.role + "'");
    }
  }
  if (opt.add_generation_prompt) {
    out += "<|im_start|>assistant\n";
    if (opt.enable_thinking.has_value() && !*opt.enable_thinking) out += "<think>\n\n</think>\n\n";
    else if (style.opens_think) out += "<think>\n";
  }
  return out;
}

std::vector<ChatMessage> parse_chat_messages(const std::string& text, const std::string& where) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw Error(where + ": not valid JSON: " + e.what());
  }
  if (j.is_object() && j.contains("messages")) j = j["messages"];
  if (!j.is_array() || j.empty()) throw Error(where + ": expected a non-empty JSON list of {\"role\", \"content\"} messages");
  std::vector<ChatMessage> out;
  for (std::size_t i = 0; i < j.size(); ++i) {
    const auto& m = j[i];
    const std::string at = where + ": message " + std::to_string(i);
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string()) throw Error(at + ": no \"role\" string");
    ChatMessage cm;
    cm.role = m["role"].get<std::string>();
    if (cm.role != "system" && cm.role != "user" && cm.role != "assistant" && cm.role != "tool") throw Error(at + ": unknown role '" + cm.role + "'");
    const auto& c = m.contains("content") ? m["content"] : nlohmann::json();
    if (c.is_string()) {
      cm.content = c.get<std::string>();
    } else if (c.is_array()) {
      for (const auto& part : c) {
        if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") || !part["text"].is_string())
          throw Error(at + ": only text content parts are supported");
        cm.content += part["text"].get<std::string>();
      }
    } else if (!c.is_null()) {
      throw Error(at + ": \"content\" must be a string or a list of text parts");
    }
    if (m.contains("reasoning_content") && m["reasoning_content"].is_string()) cm.reasoning_content = m["reasoning_content"].get<std::string>();
    out.push_back(std::move(cm));
  }
  return out;
}

}  // namespace coli
