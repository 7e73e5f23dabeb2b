// Chat prompts of the families kb-nano serves (text/chat.h): the text each format renders, the family found from a
// template's markers or from the tokenizer's tokens, and the errors for messages in the wrong order.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "kbn/error.h"
#include "text/chat.h"

namespace {

using kbn::text::ChatFormat;
using kbn::text::ChatMessage;
using kbn::text::ChatTemplate;
using kbn::text::Tokenizer;

// A byte-less BPE tokenizer holding just these added tokens: enough for the formats' token checks.
Tokenizer with_tokens(const std::vector<std::string>& tokens) {
  std::string added, vocab;
  for (size_t i = 0; i < tokens.size(); ++i) {
    added += std::string(i ? "," : "") + R"({"id":)" + std::to_string(i) + R"(,"content":")" + tokens[i] +
             R"(","special":true})";
    vocab += std::string(i ? "," : "") + "\"" + tokens[i] + "\":" + std::to_string(i);
  }
  return Tokenizer::from_json_text(R"({"added_tokens":[)" + added + R"(],"model":{"type":"BPE","vocab":{)" + vocab +
                                       "},\"merges\":[]}}",
                                   "test.json");
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const kbn::Error& e) {
    return e.what();
  }
  return "(no error)";
}

const std::vector<ChatMessage> kConversation = {
    {"system", "Be brief."}, {"user", " Hi "}, {"assistant", "Hello."}, {"user", "2+2?"}};

TEST(Chat, Llama3RendersTrimmedTurnsAfterTheBos) {
  const Tokenizer tok = Tokenizer::from_file(std::string(KBN_SOURCE_DIR) + "/models/tokenizers/tiny-llama.json");
  const auto t = ChatTemplate::detect("", tok);
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(t->format, ChatFormat::llama3);
  EXPECT_FALSE(t->dated_system);
  EXPECT_EQ(t->render(kConversation),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nHello.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\n2+2?<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  // The 3.1+ template (its text holds the knowledge date) always opens with a dated system turn.
  const auto dated = ChatTemplate::detect("{{ '<|start_header_id|>' }} Cutting Knowledge Date: ...", tok);
  ASSERT_TRUE(dated.has_value());
  EXPECT_TRUE(dated->dated_system);
  EXPECT_EQ(dated->render({{"user", "Hi"}}),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\n"
            "Today Date: 26 Jul 2024\n\n<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

TEST(Chat, ChatMLKeepsContentAsWritten) {
  const Tokenizer tok = with_tokens({"<|im_start|>", "<|im_end|>"});
  const auto t = ChatTemplate::detect("", tok);
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(t->format, ChatFormat::chatml);
  EXPECT_EQ(t->render(kConversation),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n Hi <|im_end|>\n"
            "<|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n");
}

TEST(Chat, GemmaPutsTheSystemMessageInTheFirstUserTurn) {
  const Tokenizer tok = with_tokens({"<bos>", "<start_of_turn>", "<end_of_turn>"});
  const auto t = ChatTemplate::detect("", tok);
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(t->format, ChatFormat::gemma);
  EXPECT_EQ(t->render(kConversation),
            "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello.<end_of_turn>\n"
            "<start_of_turn>user\n2+2?<end_of_turn>\n<start_of_turn>model\n");
}

TEST(Chat, MistralWrapsUserTurnsInInst) {
  const Tokenizer tok = with_tokens({"<s>", "</s>", "[INST]", "[/INST]"});
  const auto t = ChatTemplate::detect("", tok);
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(t->format, ChatFormat::mistral);
  EXPECT_EQ(t->render(kConversation), "<s>[INST] Be brief.\n\n Hi  [/INST]Hello.</s>[INST] 2+2? [/INST]");
}

TEST(Chat, TheFolderTemplateDecidesOverTheTokens) {
  const Tokenizer tok = with_tokens({"<|im_start|>", "<|im_end|>", "<s>", "</s>"});
  const auto dir = std::filesystem::temp_directory_path() / "kbn_chat_test";
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "tokenizer_config.json") << R"({"chat_template": "{{ bos_token }}[INST] {{ m }} [/INST]"})";
  EXPECT_EQ(ChatTemplate::for_folder(dir.string(), tok).format, ChatFormat::mistral);
  std::ofstream(dir / "chat_template.jinja") << "{% for m in messages %}<|im_start|>{{ m.role }}{% endfor %}";
  EXPECT_EQ(ChatTemplate::for_folder(dir.string(), tok).format, ChatFormat::chatml);
  std::ofstream(dir / "chat_template.jinja") << "{{ messages | tojson }}";
  EXPECT_NE(error_of([&] { ChatTemplate::for_folder(dir.string(), tok); }).find("none of the families"),
            std::string::npos);
  std::filesystem::remove_all(dir);
}

TEST(Chat, BadConversationsAreRefusedNamingTheMessage) {
  const Tokenizer tok = with_tokens({"<|im_start|>", "<|im_end|>"});
  const ChatTemplate t = *ChatTemplate::detect("", tok);
  EXPECT_NE(error_of([&] { t.render({}); }).find("at least one message"), std::string::npos);
  EXPECT_NE(error_of([&] { t.render({{"user", "a"}, {"system", "b"}}); }).find("message 1 has role 'system'"),
            std::string::npos);
  EXPECT_NE(error_of([&] { t.render({{"user", "a"}, {"assistant", "b"}}); }).find("last message must be the user's"),
            std::string::npos);
  EXPECT_NE(error_of([&] { t.render({{"bot", "a"}}); }).find("message 0 has role 'bot', expected 'user'"),
            std::string::npos);
  // A format whose tokens the tokenizer lacks is refused when it is picked, not rendered wrong.
  const Tokenizer half = with_tokens({"<|start_header_id|>"});
  EXPECT_NE(error_of([&] { ChatTemplate::detect("", half); }).find("'<|begin_of_text|>'"), std::string::npos);
  EXPECT_FALSE(ChatTemplate::detect("", with_tokens({"<pad>"})).has_value());
}

}  // namespace
