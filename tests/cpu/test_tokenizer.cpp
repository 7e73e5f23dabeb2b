// The tokenizer against Hugging Face `tokenizers`: llama.cpp's vocabulary test corpora and the ids AutoTokenizer gave
// for them (tests/fixtures/tokenizers/*/SOURCE.json says where each came from; tools/tokenizer_fixture.py made them).
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "kbn/error.h"
#include "text/tokenizer.h"

namespace {

using kbn::text::DecodeStream;
using kbn::text::Tokenizer;

std::string fixture(const std::string& family, const std::string& file) {
  return std::string(KBN_FIXTURE_DIR) + "/tokenizers/" + family + "/" + file;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << path;
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct Corpus {
  std::vector<std::string> texts;
  std::vector<std::vector<int32_t>> ids;
};

Corpus corpus(const std::string& family) {
  Corpus c;
  const std::string inp = read_file(fixture(family, "tests.inp"));
  const std::string sep = "\n__ggml_vocab_test__\n";
  for (size_t i = 0; i < inp.size();) {
    const size_t j = inp.find(sep, i);
    if (j == std::string::npos) {  // a last test with no separator after it
      c.texts.push_back(inp.substr(i));
      break;
    }
    c.texts.push_back(inp.substr(i, j - i));
    i = j + sep.size();
  }
  std::istringstream out(read_file(fixture(family, "tests.out")));
  std::string line;
  while (std::getline(out, line)) {
    std::istringstream ls(line);
    std::vector<int32_t> ids;
    int32_t id = 0;
    while (ls >> id) ids.push_back(id);
    c.ids.push_back(ids);
  }
  return c;
}

std::string show(const std::vector<int32_t>& ids) {
  std::string s;
  for (int32_t id : ids) s += " " + std::to_string(id);
  return s;
}

class TokenizerCorpus : public testing::TestWithParam<std::string> {};

TEST_P(TokenizerCorpus, EncodesEveryTextAsHuggingFaceDid) {
  const Tokenizer tok = Tokenizer::from_file(fixture(GetParam(), "tokenizer.json"));
  const Corpus c = corpus(GetParam());
  ASSERT_GE(c.texts.size(), 40u);
  ASSERT_EQ(c.texts.size(), c.ids.size());
  for (size_t i = 0; i < c.texts.size(); ++i)
    EXPECT_EQ(tok.encode(c.texts[i]), c.ids[i])
        << "test " << i << " '" << c.texts[i] << "': got" << show(tok.encode(c.texts[i])) << ", expected"
        << show(c.ids[i]);
}

TEST_P(TokenizerCorpus, DecodingGivesTheTextBack) {
  const Tokenizer tok = Tokenizer::from_file(fixture(GetParam(), "tokenizer.json"));
  const Corpus c = corpus(GetParam());
  for (size_t i = 0; i < c.texts.size(); ++i) EXPECT_EQ(tok.decode(c.ids[i]), c.texts[i]) << "test " << i;
}

// Text streamed one id at a time is the text decoded at once, with nothing out before its character is whole.
TEST_P(TokenizerCorpus, StreamedTextIsTheDecodedText) {
  const Tokenizer tok = Tokenizer::from_file(fixture(GetParam(), "tokenizer.json"));
  const Corpus c = corpus(GetParam());
  for (size_t i = 0; i < c.texts.size(); ++i) {
    DecodeStream stream(tok, false);
    std::string text;
    for (int32_t id : c.ids[i]) {
      const std::string piece = stream.push(id);
      EXPECT_TRUE(kbn::text::valid_utf8(piece)) << "test " << i << ": a piece split a character";
      EXPECT_EQ(piece.find("\xEF\xBF\xBD"), std::string::npos) << "test " << i;
      text += piece;
    }
    text += stream.flush();
    EXPECT_EQ(text, tok.decode(c.ids[i])) << "test " << i;
  }
  // After a prompt: the generated part only, as decode(prompt + generated) minus decode(prompt); a character the
  // prompt leaves unfinished (its U+FFFD) comes with the token that finishes it. Every split of the longest test.
  const std::vector<int32_t>& all = c.ids.back();
  ASSERT_GT(all.size(), 20u);
  for (size_t split = 1; split < all.size(); ++split) {
    const std::vector<int32_t> prompt(all.begin(), all.begin() + long(split));
    DecodeStream stream(tok, false, prompt);
    std::string text;
    for (size_t k = split; k < all.size(); ++k) text += stream.push(all[k]);
    text += stream.flush();
    std::string head = tok.decode(prompt);
    while (head.ends_with("\xEF\xBF\xBD")) head.resize(head.size() - 3);
    EXPECT_EQ(head + text, tok.decode(all)) << "prompt of " << split << " ids";
  }
}

INSTANTIATE_TEST_SUITE_P(LlamaCppVocabularies, TokenizerCorpus, testing::Values("llama-bpe", "qwen2", "llama-spm", "gemma4"),
                         [](const auto& info) {
                           std::string s = info.param;
                           for (char& ch : s)
                             if (ch == '-') ch = '_';
                           return s;
                         });

TEST(Tokenizer, SpecialTokensInTheTextAreThemselves) {
  const Tokenizer tok = Tokenizer::from_file(fixture("llama-bpe", "tokenizer.json"));
  const int32_t bos = *tok.token_to_id("<|begin_of_text|>");
  const int32_t eot = *tok.token_to_id("<|eot_id|>");
  EXPECT_EQ(bos, 128000);
  EXPECT_EQ(eot, 128009);
  const std::vector<int32_t> hello = tok.encode("Hello world");
  EXPECT_EQ(hello, (std::vector<int32_t>{9906, 1917}));  // tests.out, line 13
  std::vector<int32_t> expected{bos};
  expected.insert(expected.end(), hello.begin(), hello.end());
  expected.push_back(eot);
  EXPECT_EQ(tok.encode("<|begin_of_text|>Hello world<|eot_id|>"), expected);
  EXPECT_EQ(tok.decode(expected), "<|begin_of_text|>Hello world<|eot_id|>");
  EXPECT_EQ(tok.decode(expected, /*skip_special_tokens=*/true), "Hello world");
  EXPECT_TRUE(tok.is_special(bos));
  EXPECT_FALSE(tok.is_special(hello[0]));
  // The post-processor's template puts BOS first; Qwen2's has none.
  std::vector<int32_t> with_bos{bos};
  with_bos.insert(with_bos.end(), hello.begin(), hello.end());
  EXPECT_EQ(tok.encode("Hello world", /*add_special_tokens=*/true), with_bos);
  const Tokenizer qwen = Tokenizer::from_file(fixture("qwen2", "tokenizer.json"));
  EXPECT_EQ(qwen.encode("Hello world", true), qwen.encode("Hello world"));
  const int32_t im_start = *qwen.token_to_id("<|im_start|>");
  EXPECT_EQ(qwen.encode("<|im_start|>Hello"), (std::vector<int32_t>{im_start, 9707}));
  // SentencePiece: <s> from the template, and the text after an added token starts a new segment.
  const Tokenizer spm = Tokenizer::from_file(fixture("llama-spm", "tokenizer.json"));
  EXPECT_EQ(spm.encode("Hello world", true), (std::vector<int32_t>{1, 15043, 3186}));
}

TEST(Tokenizer, VocabularyLookups) {
  const Tokenizer tok = Tokenizer::from_file(fixture("llama-spm", "tokenizer.json"));
  // The fixture keeps the ids of a pruned vocabulary: the largest one it holds sets the size.
  ASSERT_GT(tok.vocab_size(), 31000);
  EXPECT_TRUE(tok.id_to_token(int32_t(tok.vocab_size() - 1)).has_value());
  EXPECT_FALSE(tok.id_to_token(int32_t(tok.vocab_size())).has_value());
  EXPECT_EQ(tok.id_to_token(1), "<s>");
  EXPECT_EQ(tok.id_to_token(3), "<0x00>");
  EXPECT_FALSE(tok.id_to_token(-1).has_value());
  EXPECT_FALSE(tok.token_to_id("no such token").has_value());
}

TEST(Tokenizer, BadInputIsRefusedWithItsPlace) {
  const Tokenizer tok = Tokenizer::from_file(fixture("llama-bpe", "tokenizer.json"));
  try {
    tok.encode(std::string("ab\xFF" "cd"));
    FAIL() << "invalid UTF-8 was encoded";
  } catch (const kbn::Error& e) {
    EXPECT_NE(std::string(e.what()).find("not valid UTF-8 (first bad byte at offset 2)"), std::string::npos)
        << e.what();
  }
  EXPECT_FALSE(kbn::text::valid_utf8("\xE2\x82"));          // truncated
  EXPECT_FALSE(kbn::text::valid_utf8("\xC0\xAF"));          // overlong
  EXPECT_FALSE(kbn::text::valid_utf8("\xED\xA0\x80"));      // a surrogate
  EXPECT_TRUE(kbn::text::valid_utf8("\xF0\x9F\xA6\x99"));   // 🦙
  int32_t absent = 1000;  // an id the pruned fixture does not hold
  while (tok.id_to_token(absent)) ++absent;
  for (const int32_t id : {absent, int32_t(-1), int32_t(tok.vocab_size())}) {
    const std::vector<int32_t> bad{9906, id};
    try {
      tok.decode(bad);
      ADD_FAILURE() << "id " << id << " was decoded";
    } catch (const kbn::Error& e) {
      EXPECT_NE(std::string(e.what()).find("no token has id " + std::to_string(id)), std::string::npos) << e.what();
    }
  }
}

std::string error_of(const std::string& json_text) {
  try {
    Tokenizer::from_json_text(json_text, "t.json");
  } catch (const kbn::Error& e) {
    return e.what();
  }
  return "(loaded)";
}

TEST(Tokenizer, UnsupportedFilesAreRefusedByComponent) {
  EXPECT_NE(error_of("{").find("t.json: not valid JSON"), std::string::npos);
  EXPECT_NE(error_of("{}").find("no \"model\""), std::string::npos);
  EXPECT_NE(error_of(R"({"model":{"type":"WordPiece","vocab":{}}})").find("model type 'WordPiece' is not supported"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"model":{"type":"BPE","vocab":{"a":0,"b":1},"merges":["a b"]}})")
                .find("the merged token 'ab' is not in the vocabulary"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"model":{"type":"BPE","vocab":{"a":0,"b":0}}})").find("id 0 is given to both"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"model":{"type":"BPE","vocab":{}},"pre_tokenizer":{"type":"BertPreTokenizer"}})")
                .find("pre_tokenizer: pre-tokenizer 'BertPreTokenizer' is not supported"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"model":{"type":"BPE","vocab":{}},"normalizer":{"type":"Sequence","normalizers":[)"
                     R"({"type":"NFC"},{"type":"Lowercase"}]}})")
                .find("normalizer.normalizers[1]: normaliser 'Lowercase' is not supported"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"model":{"type":"BPE","vocab":{}},"pre_tokenizer":{"type":"Split","pattern":{"Regex":"("},)"
                     R"("behavior":"Isolated"}})")
                .find("does not compile"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"model":{"type":"BPE","vocab":{"a":0}},"added_tokens":[{"id":1,"content":"<x>",)"
                     R"("single_word":true}]})")
                .find("sets single_word"),
            std::string::npos);
}

// A hand-made SentencePiece-style tokenizer with the Metaspace pre-tokenizer of newer Llama/Mistral files: prepend
// only at the start of the text ("first"), byte fallback for what the vocabulary lacks, unknown characters fused.
TEST(Tokenizer, MetaspaceFirstAndByteFallback) {
  const std::string j = R"({
    "added_tokens": [{"id": 1, "content": "<s>", "special": true}],
    "pre_tokenizer": {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": false},
    "decoder": {"type": "Sequence", "decoders": [{"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
                {"type": "ByteFallback"}, {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
    "model": {"type": "BPE", "byte_fallback": true, "fuse_unk": true, "unk_token": "<unk>",
              "vocab": {"<unk>": 0, "<s>": 1, "<0xC3>": 2, "<0xA9>": 3, "\u2581": 4, "h": 5, "i": 6, "\u2581h": 7,
                        "\u2581hi": 8, "hi": 9},
              "merges": [["\u2581", "h"], ["\u2581h", "i"], ["h", "i"]]}})";
  const Tokenizer tok = Tokenizer::from_json_text(j, "inline");
  EXPECT_EQ(tok.encode("hi hi"), (std::vector<int32_t>{8, 8}));
  // After <s> the text is not at the start: no ▁ is put in front of it.
  EXPECT_EQ(tok.encode("<s>hi"), (std::vector<int32_t>{1, 9}));
  // é is not in the vocabulary: its two UTF-8 bytes; decoding joins them back.
  EXPECT_EQ(tok.encode("hié"), (std::vector<int32_t>{8, 2, 3}));
  EXPECT_EQ(tok.decode(std::vector<int32_t>{8, 2, 3}), "hié");
  // A lone half of é decodes to U+FFFD; streamed, nothing comes out until the character is whole.
  EXPECT_EQ(tok.decode(std::vector<int32_t>{8, 2}), "hi\xEF\xBF\xBD");
  DecodeStream s(tok, false);
  EXPECT_EQ(s.push(8), "hi");
  EXPECT_EQ(s.push(2), "");
  EXPECT_EQ(s.push(3), "é");
}

}  // namespace

namespace {

// Hugging Face `tokenizers` on each fixture's tokenizer.json, for the extra corpus (special tokens written in the
// text, code, whitespace runs, scripts, emoji, combining marks): encode with and without the post-processor's
// special tokens, decode with and without skipping them (hf_truth.json, made on the GPU machine by
// tools/tokenizer_hf_truth.py). tests.out already ties each file's layout to the published tokenizer.
class TokenizerHfTruth : public testing::TestWithParam<std::string> {};

TEST_P(TokenizerHfTruth, EncodesAndDecodesTheExtraCorpusAsTokenizersDoes) {
  const Tokenizer tok = Tokenizer::from_file(fixture(GetParam(), "tokenizer.json"));
  const nlohmann::json truth = nlohmann::json::parse(read_file(fixture(GetParam(), "hf_truth.json")));
  ASSERT_TRUE(truth.at("corpus_matches_tests_out").get<bool>());
  const auto& rows = truth.at("texts");
  ASSERT_GE(rows.size(), 20u);
  for (size_t i = 0; i < rows.size(); ++i) {
    const std::string text = rows[i].at("text").get<std::string>();
    const auto ids = rows[i].at("ids").get<std::vector<int32_t>>();
    const auto ids_special = rows[i].at("ids_special").get<std::vector<int32_t>>();
    EXPECT_EQ(show(tok.encode(text, false)), show(ids)) << "text " << i;
    EXPECT_EQ(show(tok.encode(text, true)), show(ids_special)) << "text " << i;
    EXPECT_EQ(tok.decode(ids_special, false), rows[i].at("decode").get<std::string>()) << "text " << i;
    EXPECT_EQ(tok.decode(ids_special, true), rows[i].at("decode_skip").get<std::string>()) << "text " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(LlamaCppVocabularies, TokenizerHfTruth,
                         testing::Values("llama-bpe", "qwen2", "llama-spm", "gemma4"), [](const auto& info) {
                           std::string s = info.param;
                           for (char& ch : s)
                             if (ch == '-') ch = '_';
                           return s;
                         });

}  // namespace
