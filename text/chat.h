#pragma once
// Chat prompts for the model families kb-nano serves, hand-coded from their published Jinja chat templates (no
// Jinja engine here). Each renders what transformers' apply_chat_template(messages, add_generation_prompt=True)
// gives for plain text messages (no tools, no images), to be encoded with add_special_tokens=false (the BOS is in
// the text):
//   llama3      Llama-3 / 3.1 / 3.2 / 3.3 Instruct. With `dated_system` (the 3.1+ templates, whose text holds
//               "Cutting Knowledge Date"), a system turn always comes first, dated as their default date_string
//               ("26 Jul 2024"). Content is trimmed.
//   chatml      Qwen2 / Qwen2.5 / Qwen3 (<|im_start|>role\n...<|im_end|>\n). No default system turn (Qwen2.5's
//               "You are Qwen..." default is not added); Qwen3's thinking is left on (nothing after the prompt).
//   gemma       Gemma-2 / Gemma-3 (<start_of_turn>user|model ... <end_of_turn>\n, BOS first); a system message is
//               put in front of the first user turn followed by a blank line, as Gemma-3's template does.
//   mistral     Mistral / Mixtral Instruct ([INST] ... [/INST], BOS first, </s> after each answer); a system
//               message goes in front of the first user message followed by a blank line (v0.1 templates refuse
//               system messages).
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "text/tokenizer.h"

namespace kbn::text {

enum class ChatFormat { llama3, chatml, gemma, mistral };

struct ChatMessage {
  std::string role;  // system, user or assistant
  std::string content;
};

struct ChatTemplate {
  ChatFormat format = ChatFormat::llama3;
  bool dated_system = false;  // llama3 only: the 3.1+ system turn with its knowledge and today dates
  std::string bos, eos;       // the special tokens the format writes (checked present in the tokenizer)

  // The family of a tokenizer_config.json chat_template (by the markers each family's template holds), else, with
  // no template text, of the tokenizer's special tokens. nullopt when neither names a family above.
  static std::optional<ChatTemplate> detect(std::string_view chat_template_text, const Tokenizer& tok);
  // The template of a model folder: its chat_template.jinja, else the chat_template of its tokenizer_config.json
  // (a string, or a list whose "default" entry is taken); with neither, the tokenizer's tokens decide. Throws naming
  // what was read and the families known when none matches.
  static ChatTemplate for_folder(const std::string& folder, const Tokenizer& tok);

  // The prompt text, ending with the assistant's turn opened (add_generation_prompt). Roles are checked: system
  // (first only), then user and assistant alternating from user; errors name the message and what was expected.
  std::string render(const std::vector<ChatMessage>& messages) const;
  const char* name() const;
};

}  // namespace kbn::text
