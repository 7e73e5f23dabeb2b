#pragma once
// Text <-> token ids, read from a Hugging Face tokenizer.json.
//
// Supported, and checked token for token against Hugging Face `tokenizers` (tests/cpu/test_tokenizer.cpp):
//   - byte-level BPE as in Llama-3 and Qwen2/Qwen3: a Split pre-tokenizer (PCRE2 with Unicode properties stands in
//     for the Oniguruma regex of `tokenizers`), the ByteLevel byte->character map, ignore_merges, an NFC normaliser;
//   - SentencePiece-style BPE as in Llama-2 and Mistral/Mixtral: Prepend/Replace normalisers or a Metaspace
//     pre-tokenizer, byte fallback (<0xXX> tokens), fuse_unk;
//   - added tokens (special or not) split out of the text before anything else, longest match first;
//   - a TemplateProcessing post-processor (the BOS that `add_special_tokens` puts in front).
// Anything else in a tokenizer.json (WordPiece or Unigram models, other normalisers or pre-tokenizers, a
// continuing_subword_prefix) is refused at load with the component's name, never approximated.
//
// Encoding is deterministic and thread-safe (no cache); decoding follows the file's decoder chain.
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kbn::text {

struct AddedToken {
  int32_t id = -1;
  std::string content;
  bool special = false;
  bool lstrip = false;  // whitespace before it is part of the match
  bool rstrip = false;  // whitespace after it is part of the match
};

class Tokenizer {
 public:
  // Reads a tokenizer.json; errors name the file and the field or component at fault.
  static Tokenizer from_file(const std::string& path);
  // The same from the file's text (`origin` names it in errors).
  static Tokenizer from_json_text(std::string_view json_text, const std::string& origin);

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // Token ids of `text` (which must be valid UTF-8). Added tokens in the text are recognised as themselves.
  // `add_special_tokens`: apply the post-processor's template (e.g. a leading BOS), as transformers' encode().
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens = false) const;

  // The text of `ids` through the file's decoder. Special added tokens are dropped with `skip_special_tokens`.
  // An id with no token is an error naming it.
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens = false) const;

  // One more than the largest id of the vocabulary and added tokens.
  int64_t vocab_size() const;
  std::optional<int32_t> token_to_id(std::string_view token) const;
  // The token's string as stored in the vocabulary (byte-level characters, U+2581 for spaces, ...).
  std::optional<std::string> id_to_token(int32_t id) const;
  bool is_special(int32_t id) const;
  const std::vector<AddedToken>& added_tokens() const;
  const std::string& origin() const;

 private:
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Streaming text for generated ids: push() returns the text the new id completes, holding back bytes of a
// character that is not finished yet (a multi-byte UTF-8 character split over byte-fallback tokens, or a byte-level
// token holding half of one). Decoding works on a sliding window of ids, so the whole is
// linear in the number of ids, and the concatenation of what push() and flush() return equals decode(all ids) for
// the byte-level and SentencePiece decoders above.
class DecodeStream {
 public:
  DecodeStream(const Tokenizer& tok, bool skip_special_tokens);
  // `prompt` sets the context (its text is not returned): a first generated token then decodes as it would after
  // the prompt (no stripped leading space, for instance). A character the prompt leaves unfinished comes out whole
  // with the token that finishes it.
  DecodeStream(const Tokenizer& tok, bool skip_special_tokens, std::span<const int32_t> prompt);
  std::string push(int32_t id);
  // What is still held back at the end (an unfinished character comes out as U+FFFD, as decode() gives it).
  std::string flush();

 private:
  const Tokenizer* tok_;
  bool skip_;
  std::vector<int32_t> ids_;
  size_t prefix_ = 0;  // ids_[prefix_, read_) decode to text already returned
  size_t read_ = 0;
  size_t first_done_ = std::string::npos;  // bytes of the window already the prompt's, when it ends mid-character
};

// True when `s` is well-formed UTF-8; otherwise `bad_at` gets the offset of the first byte that is not.
bool valid_utf8(std::string_view s, size_t* bad_at = nullptr);

}  // namespace kbn::text
