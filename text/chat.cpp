#include "text/chat.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "kbn/error.h"

namespace kbn::text {
namespace {

std::string trim(std::string_view s) {
  // Jinja's |trim: Python's str.strip(), whitespace at both ends.
  const char* ws = " \t\n\r\f\v";
  const size_t b = s.find_first_not_of(ws);
  if (b == std::string_view::npos) return {};
  const size_t e = s.find_last_not_of(ws);
  return std::string(s.substr(b, e - b + 1));
}

std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  KBN_CHECK(in.good(), "chat template: cannot read '", p.string(), "'");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The special tokens each format writes; every one must be in the tokenizer.
std::vector<std::string_view> tokens_of(ChatFormat f) {
  switch (f) {
    case ChatFormat::llama3:
      return {"<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"};
    case ChatFormat::chatml:
      return {"<|im_start|>", "<|im_end|>"};
    case ChatFormat::gemma:
      return {"<bos>", "<start_of_turn>", "<end_of_turn>"};
    case ChatFormat::mistral:
      return {"<s>", "</s>"};
  }
  return {};
}

}  // namespace

std::optional<ChatTemplate> ChatTemplate::detect(std::string_view text, const Tokenizer& tok) {
  ChatTemplate t;
  if (!text.empty()) {
    if (text.find("<|start_header_id|>") != std::string_view::npos) {
      t.format = ChatFormat::llama3;
      t.dated_system = text.find("Cutting Knowledge Date") != std::string_view::npos;
    } else if (text.find("<|im_start|>") != std::string_view::npos) {
      t.format = ChatFormat::chatml;
    } else if (text.find("<start_of_turn>") != std::string_view::npos) {
      t.format = ChatFormat::gemma;
    } else if (text.find("[INST]") != std::string_view::npos) {
      t.format = ChatFormat::mistral;
    } else {
      return std::nullopt;
    }
  } else if (tok.token_to_id("<|start_header_id|>")) t.format = ChatFormat::llama3;
  else if (tok.token_to_id("<|im_start|>")) t.format = ChatFormat::chatml;
  else if (tok.token_to_id("<start_of_turn>")) t.format = ChatFormat::gemma;
  else if (tok.token_to_id("[INST]")) t.format = ChatFormat::mistral;
  else return std::nullopt;
  for (std::string_view token : tokens_of(t.format))
    KBN_CHECK(tok.token_to_id(token).has_value(), "chat template: the ", t.name(), " format writes '", token,
              "', which the tokenizer (", tok.origin(), ") does not have");
  if (t.format == ChatFormat::llama3) t.bos = "<|begin_of_text|>";
  if (t.format == ChatFormat::gemma) t.bos = "<bos>";
  if (t.format == ChatFormat::mistral) t.bos = "<s>", t.eos = "</s>";
  return t;
}

ChatTemplate ChatTemplate::for_folder(const std::string& folder, const Tokenizer& tok) {
  namespace fs = std::filesystem;
  const fs::path dir(folder);
  std::string text, source;
  if (fs::exists(dir / "chat_template.jinja")) {
    source = (dir / "chat_template.jinja").string();
    text = read_file(source);
  } else if (fs::exists(dir / "tokenizer_config.json")) {
    source = (dir / "tokenizer_config.json").string();
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(read_file(source));
    } catch (const nlohmann::json::exception& e) {
      KBN_FAIL("chat template: '", source, "' is not valid JSON: ", e.what());
    }
    if (j.contains("chat_template") && j.at("chat_template").is_string()) {
      text = j.at("chat_template").get<std::string>();
    } else if (j.contains("chat_template") && j.at("chat_template").is_array()) {
      for (const auto& e : j.at("chat_template"))
        if (e.is_object() && e.value("name", "") == "default" && e.contains("template") && e.at("template").is_string())
          text = e.at("template").get<std::string>();
      KBN_CHECK(!text.empty(), "chat template: '", source, "' lists chat templates but none named 'default'");
    }
  }
  const std::optional<ChatTemplate> t = detect(text, tok);
  KBN_CHECK(t.has_value(), "chat template: ",
            text.empty() ? "no chat_template.jinja or tokenizer_config.json chat_template in '" + folder +
                               "', and the tokenizer's special tokens name no family"
                         : "the template in '" + source + "' is none of the families kb-nano knows",
            " (known: Llama-3 <|start_header_id|>, ChatML <|im_start|> as Qwen, Gemma <start_of_turn>, Mistral [INST])");
  return *t;
}

const char* ChatTemplate::name() const {
  switch (format) {
    case ChatFormat::llama3:
      return dated_system ? "llama3 (3.1+, dated system turn)" : "llama3";
    case ChatFormat::chatml:
      return "chatml (Qwen)";
    case ChatFormat::gemma:
      return "gemma";
    case ChatFormat::mistral:
      return "mistral";
  }
  return "?";
}

std::string ChatTemplate::render(const std::vector<ChatMessage>& messages) const {
  KBN_CHECK(!messages.empty(), "chat: at least one message is needed");
  std::string system;
  bool has_system = false;
  size_t first = 0;
  if (messages[0].role == "system") {
    has_system = true;
    system = messages[0].content;
    first = 1;
  }
  for (size_t i = first; i < messages.size(); ++i) {
    const char* want = (i - first) % 2 == 0 ? "user" : "assistant";
    KBN_CHECK(messages[i].role == want, "chat: message ", i, " has role '", messages[i].role, "', expected '", want,
              "' (a system message may only come first; then user and assistant alternate, starting with user)");
  }
  KBN_CHECK(messages.back().role == "user", "chat: the last message must be the user's (the assistant answers it)");
  std::string out;
  switch (format) {
    case ChatFormat::llama3: {
      out = bos;
      auto turn = [&](std::string_view role, std::string_view content) {
        out += "<|start_header_id|>";
        out += role;
        out += "<|end_header_id|>\n\n" + trim(content) + "<|eot_id|>";
      };
      if (dated_system) {
        out += "<|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\nToday Date: "
               "26 Jul 2024\n\n" + trim(system) + "<|eot_id|>";
      } else if (has_system) {
        turn("system", system);
      }
      for (size_t i = first; i < messages.size(); ++i) turn(messages[i].role, messages[i].content);
      out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
      break;
    }
    case ChatFormat::chatml:
      if (has_system) out += "<|im_start|>system\n" + system + "<|im_end|>\n";
      for (size_t i = first; i < messages.size(); ++i)
        out += "<|im_start|>" + messages[i].role + "\n" + messages[i].content + "<|im_end|>\n";
      out += "<|im_start|>assistant\n";
      break;
    case ChatFormat::gemma:
      out = bos;
      for (size_t i = first; i < messages.size(); ++i) {
        const bool user = messages[i].role == "user";
        out += std::string("<start_of_turn>") + (user ? "user" : "model") + "\n";
        if (i == first && has_system) out += trim(system) + "\n\n";
        out += trim(messages[i].content) + "<end_of_turn>\n";
      }
      out += "<start_of_turn>model\n";
      break;
    case ChatFormat::mistral:
      out = bos;
      for (size_t i = first; i < messages.size(); ++i) {
        if (messages[i].role == "user")
          out += "[INST] " + (i == first && has_system ? system + "\n\n" : std::string()) + messages[i].content +
                 " [/INST]";
        else
          out += messages[i].content + eos;
      }
      break;
  }
  return out;
}

}  // namespace kbn::text
