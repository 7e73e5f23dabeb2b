// Byte-level and SentencePiece-style BPE from a Hugging Face tokenizer.json (see tokenizer.h).
#include "text/tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <utf8proc.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <queue>
#include <sstream>
#include <unordered_map>

#include "kbn/error.h"

namespace kbn::text {

using json = nlohmann::json;

// ---- UTF-8 ----

bool valid_utf8(std::string_view s, size_t* bad_at) {
  size_t i = 0;
  const auto fail = [&] {
    if (bad_at) *bad_at = i;
    return false;
  };
  while (i < s.size()) {
    const auto c = uint8_t(s[i]);
    size_t n = 0;
    uint32_t cp = 0, min = 0;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      n = 1, cp = c & 0x1F, min = 0x80;
    } else if ((c & 0xF0) == 0xE0) {
      n = 2, cp = c & 0x0F, min = 0x800;
    } else if ((c & 0xF8) == 0xF0) {
      n = 3, cp = c & 0x07, min = 0x10000;
    } else {
      return fail();
    }
    for (size_t k = 1; k <= n; ++k) {
      if (i + k >= s.size()) return fail();
      const auto d = uint8_t(s[i + k]);
      if ((d & 0xC0) != 0x80) return fail();
      cp = (cp << 6) | (d & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return fail();
    i += n + 1;
  }
  return true;
}

namespace {

// Length of the UTF-8 character starting with byte c (1 for a stray continuation byte).
size_t char_len(uint8_t c) {
  if (c < 0x80) return 1;
  if ((c & 0xE0) == 0xC0) return 2;
  if ((c & 0xF0) == 0xE0) return 3;
  if ((c & 0xF8) == 0xF0) return 4;
  return 1;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += char(cp);
  } else if (cp < 0x800) {
    out += char(0xC0 | (cp >> 6));
    out += char(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += char(0xE0 | (cp >> 12));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  } else {
    out += char(0xF0 | (cp >> 18));
    out += char(0x80 | ((cp >> 12) & 0x3F));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  }
}

uint32_t decode_char(std::string_view s, size_t i, size_t n) {
  const auto c = uint8_t(s[i]);
  if (n == 1) return c;
  uint32_t cp = c & (0xFF >> (n + 1));
  for (size_t k = 1; k < n; ++k) cp = (cp << 6) | (uint8_t(s[i + k]) & 0x3F);
  return cp;
}

constexpr std::string_view kReplacementChar = "\xEF\xBF\xBD";  // U+FFFD

// Bytes -> text, each maximal invalid sequence replaced by U+FFFD (as Rust's from_utf8_lossy, which `tokenizers`
// uses): a truncated character is one U+FFFD, any other bad byte one each.
std::string utf8_lossy(std::string_view b) {
  std::string out;
  size_t i = 0;
  while (i < b.size()) {
    const auto c = uint8_t(b[i]);
    const size_t n = char_len(c);
    if (c < 0x80) {
      out += char(c);
      ++i;
      continue;
    }
    if (n == 1 || c == 0xC0 || c == 0xC1 || c > 0xF4) {  // never a valid lead byte
      out += kReplacementChar;
      ++i;
      continue;
    }
    // Valid second-byte ranges (Unicode table 3-7) decide how far an invalid prefix reaches.
    size_t k = 1;
    for (; k < n && i + k < b.size(); ++k) {
      const auto d = uint8_t(b[i + k]);
      uint8_t lo = 0x80, hi = 0xBF;
      if (k == 1) {
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
      }
      if (d < lo || d > hi) break;
    }
    if (k == n) {
      out.append(b.substr(i, n));
      i += n;
    } else {
      out += kReplacementChar;
      i += k;
    }
  }
  return out;
}

// GPT-2's byte -> printable character map (bytes that print as themselves keep their code point; the rest are
// moved to U+0100..).
struct ByteMap {
  std::array<std::string, 256> to_char;
  std::unordered_map<uint32_t, uint8_t> to_byte;
  ByteMap() {
    uint32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool keeps = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      const uint32_t cp = keeps ? uint32_t(b) : next++;
      append_utf8(to_char[size_t(b)], cp);
      to_byte[cp] = uint8_t(b);
    }
  }
};
const ByteMap& byte_map() {
  static const ByteMap m;
  return m;
}

bool is_whitespace_cp(uint32_t cp) {
  // Rust's char::is_whitespace (Unicode White_Space).
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
         cp == 0x3000;
}

void replace_all(std::string& s, std::string_view from, std::string_view to) {
  if (from.empty()) return;
  std::string out;
  size_t i = 0;
  while (true) {
    const size_t j = s.find(from, i);
    if (j == std::string::npos) break;
    out.append(s, i, j - i);
    out.append(to);
    i = j + from.size();
  }
  out.append(s, i, std::string::npos);
  s = std::move(out);
}

// ---- a compiled PCRE2 regex ----
class Regex {
 public:
  Regex(const std::string& pattern, bool literal, const std::string& where) {
    int err = 0;
    PCRE2_SIZE at = 0;
    const uint32_t flags = PCRE2_UTF | PCRE2_UCP | (literal ? PCRE2_LITERAL : 0);
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), flags, &err, &at, nullptr);
    if (!code_) {
      std::array<PCRE2_UCHAR, 256> msg{};
      pcre2_get_error_message(err, msg.data(), msg.size());
      KBN_FAIL(where, ": the pattern '", pattern, "' does not compile (", reinterpret_cast<const char*>(msg.data()),
               " at offset ", at, ")");
    }
    pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE);  // best effort: the interpreter gives the same matches
  }
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;
  ~Regex() { pcre2_code_free(code_); }

  // [begin, end) of every non-empty match, left to right.
  std::vector<std::pair<size_t, size_t>> matches(std::string_view s) const {
    std::vector<std::pair<size_t, size_t>> out;
    pcre2_match_data* md = pcre2_match_data_create_from_pattern(code_, nullptr);
    KBN_CHECK(md, "tokenizer: out of memory for a regex match");
    size_t pos = 0;
    while (pos <= s.size()) {
      const int rc = pcre2_match(code_, reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), pos, PCRE2_NO_UTF_CHECK,
                                 md, nullptr);
      if (rc == PCRE2_ERROR_NOMATCH) break;
      if (rc < 0) {
        pcre2_match_data_free(md);
        KBN_FAIL("tokenizer: regex match failed with PCRE2 error ", rc);
      }
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
      size_t b = ov[0], e = ov[1];
      if (e == b) {  // an empty match: step one character on
        pos = b + (b < s.size() ? char_len(uint8_t(s[b])) : 1);
        continue;
      }
      out.emplace_back(b, e);
      pos = e;
    }
    pcre2_match_data_free(md);
    return out;
  }

 private:
  pcre2_code* code_ = nullptr;
};

// ---- components ----

struct NormStep {
  enum Kind { NFC, NFKC, Prepend, Replace } kind;
  std::string a, b;
};

enum class SplitBehavior { Isolated, Removed, MergedWithPrevious, MergedWithNext };

struct Piece {
  std::string text;
  bool at_start = false;  // begins at offset 0 of the input (Metaspace's prepend_scheme "first")
};

struct PreStep {
  enum Kind { Split, ByteLevel, Metaspace } kind;
  std::shared_ptr<Regex> regex;
  SplitBehavior behavior = SplitBehavior::Isolated;
  bool add_prefix_space = false;
  std::string replacement;        // Metaspace
  std::string prepend_scheme;     // always, first, never
  bool split = false;             // Metaspace
};

struct DecodeStep {
  enum Kind { ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace } kind;
  std::string a, b;
  size_t start = 0, stop = 0;
  bool prepend = true;  // Metaspace: strip the first token's leading space
};

std::string gpt2_regex() {
  return R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
}

std::string pattern_of(const json& p, const std::string& where, bool* literal) {
  KBN_CHECK(p.is_object(), where, ".pattern: expected {\"Regex\": ...} or {\"String\": ...}, got ", p.dump());
  if (p.contains("Regex")) {
    *literal = false;
    return p.at("Regex").get<std::string>();
  }
  if (p.contains("String")) {
    *literal = true;
    return p.at("String").get<std::string>();
  }
  KBN_FAIL(where, ".pattern: expected {\"Regex\": ...} or {\"String\": ...}, got ", p.dump());
}

std::string type_of(const json& j, const std::string& where) {
  KBN_CHECK(j.is_object() && j.contains("type") && j.at("type").is_string(), where,
            ": expected an object with a \"type\", got ", j.dump().substr(0, 200));
  return j.at("type").get<std::string>();
}

}  // namespace

struct Tokenizer::Impl {
  std::string origin;
  // model
  std::unordered_map<std::string, int32_t> vocab;
  std::vector<std::string> id_to_tok;  // "" where no token has that id
  std::vector<uint8_t> has_id;
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges;  // (left id, right id) -> (rank, merged id)
  bool byte_fallback = false, fuse_unk = false, ignore_merges = false;
  int32_t unk_id = -1;
  std::array<int32_t, 256> byte_tokens{};  // <0xXX> ids for byte fallback
  // pipeline
  std::vector<NormStep> normalizers;
  std::vector<PreStep> pre;
  std::vector<DecodeStep> decoders;
  std::vector<AddedToken> added;
  std::vector<uint8_t> special;  // by id
  std::array<std::vector<size_t>, 256> added_by_first_byte;  // indices into added, longest first
  std::vector<int32_t> template_prefix, template_suffix;
  std::string template_unsupported;  // a post-processor type encode(add_special_tokens) cannot apply

  // ---- loading ----
  void load(const json& j) {
    KBN_CHECK(j.is_object(), origin, ": expected a JSON object at the top level");
    KBN_CHECK(j.contains("model"), origin, ": no \"model\" (is this a tokenizer.json?)");
    load_model(j.at("model"));
    if (j.contains("added_tokens") && !j.at("added_tokens").is_null()) load_added(j.at("added_tokens"));
    if (j.contains("normalizer") && !j.at("normalizer").is_null()) load_normalizer(j.at("normalizer"), "normalizer");
    if (j.contains("pre_tokenizer") && !j.at("pre_tokenizer").is_null())
      load_pre(j.at("pre_tokenizer"), "pre_tokenizer");
    if (j.contains("decoder") && !j.at("decoder").is_null()) load_decoder(j.at("decoder"), "decoder");
    if (j.contains("post_processor") && !j.at("post_processor").is_null())
      load_post(j.at("post_processor"), "post_processor");
    special.assign(id_to_tok.size(), 0);
    for (const auto& a : added) special[size_t(a.id)] = a.special;
  }

  void set_token(const std::string& tok, int64_t id, const std::string& where) {
    KBN_CHECK(id >= 0 && id < (int64_t(1) << 31), origin, ": ", where, ": id ", id, " of '", tok,
              "' is out of range");
    if (size_t(id) >= id_to_tok.size()) {
      id_to_tok.resize(size_t(id) + 1);
      has_id.resize(size_t(id) + 1, 0);
    }
    if (has_id[size_t(id)]) {
      KBN_CHECK(id_to_tok[size_t(id)] == tok, origin, ": ", where, ": id ", id, " is given to both '",
                id_to_tok[size_t(id)], "' and '", tok, "'");
      return;
    }
    id_to_tok[size_t(id)] = tok;
    has_id[size_t(id)] = 1;
  }

  void load_model(const json& m) {
    const std::string type = m.contains("type") ? m.at("type").get<std::string>() : std::string("BPE");
    KBN_CHECK(type == "BPE", origin, ": model type '", type,
              "' is not supported (kb-nano reads BPE tokenizers: byte-level as Llama-3/Qwen, SentencePiece-style as "
              "Llama-2/Mistral)");
    for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
      KBN_CHECK(!m.contains(key) || m.at(key).is_null() || m.at(key).get<std::string>().empty(), origin, ": model.",
                key, " is set; kb-nano's BPE does not apply it");
    KBN_CHECK(!m.contains("dropout") || m.at("dropout").is_null(), origin,
              ": model.dropout is set; encoding here is deterministic");
    KBN_CHECK(m.contains("vocab") && m.at("vocab").is_object(), origin, ": model.vocab: expected an object of token -> id");
    for (const auto& [tok, id] : m.at("vocab").items()) {
      KBN_CHECK(id.is_number_integer(), origin, ": model.vocab['", tok, "']: expected an integer id");
      set_token(tok, id.get<int64_t>(), "model.vocab");
      vocab.emplace(tok, id.get<int32_t>());
    }
    byte_fallback = m.value("byte_fallback", false);
    fuse_unk = m.value("fuse_unk", false);
    ignore_merges = m.value("ignore_merges", false);
    if (m.contains("unk_token") && m.at("unk_token").is_string()) {
      const auto it = vocab.find(m.at("unk_token").get<std::string>());
      KBN_CHECK(it != vocab.end(), origin, ": model.unk_token '", m.at("unk_token").get<std::string>(),
                "' is not in the vocabulary");
      unk_id = it->second;
    }
    byte_tokens.fill(-1);
    if (byte_fallback) {
      for (int b = 0; b < 256; ++b) {
        char name[8];
        std::snprintf(name, sizeof name, "<0x%02X>", b);
        const auto it = vocab.find(name);
        if (it != vocab.end()) byte_tokens[size_t(b)] = it->second;
      }
    }
    if (!m.contains("merges")) return;
    const json& ms = m.at("merges");
    KBN_CHECK(ms.is_array(), origin, ": model.merges: expected an array");
    merges.reserve(ms.size());
    int32_t rank = 0;
    for (const auto& e : ms) {
      std::string a, b;
      if (e.is_string()) {
        const std::string s = e.get<std::string>();
        const size_t sp = s.find(' ');
        KBN_CHECK(sp != std::string::npos && s.find(' ', sp + 1) == std::string::npos, origin, ": model.merges[",
                  rank, "]: expected \"left right\", got '", s, "'");
        a = s.substr(0, sp);
        b = s.substr(sp + 1);
      } else {
        KBN_CHECK(e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string(), origin, ": model.merges[",
                  rank, "]: expected \"left right\" or [left, right], got ", e.dump());
        a = e[0].get<std::string>();
        b = e[1].get<std::string>();
      }
      const auto ia = vocab.find(a), ib = vocab.find(b), iab = vocab.find(a + b);
      KBN_CHECK(ia != vocab.end() && ib != vocab.end(), origin, ": model.merges[", rank, "]: '",
                ia == vocab.end() ? a : b, "' is not in the vocabulary");
      KBN_CHECK(iab != vocab.end(), origin, ": model.merges[", rank, "]: the merged token '", a + b,
                "' is not in the vocabulary");
      const uint64_t key = (uint64_t(uint32_t(ia->second)) << 32) | uint32_t(ib->second);
      merges.emplace(key, std::make_pair(rank, iab->second));  // the first (lowest) rank of a pair wins
      ++rank;
    }
  }

  void load_added(const json& list) {
    KBN_CHECK(list.is_array(), origin, ": added_tokens: expected an array");
    for (const auto& a : list) {
      KBN_CHECK(a.is_object() && a.contains("id") && a.contains("content"), origin,
                ": added_tokens: each entry needs an id and a content, got ", a.dump());
      AddedToken t;
      t.id = a.at("id").get<int32_t>();
      t.content = a.at("content").get<std::string>();
      KBN_CHECK(!t.content.empty(), origin, ": added_tokens: id ", t.id, " has empty content");
      t.special = a.value("special", false);
      t.lstrip = a.value("lstrip", false);
      t.rstrip = a.value("rstrip", false);
      KBN_CHECK(!a.value("single_word", false), origin, ": added_tokens: '", t.content,
                "' sets single_word, which kb-nano does not apply");
      set_token(t.content, t.id, "added_tokens");
      vocab.emplace(t.content, t.id);
      added.push_back(std::move(t));
    }
    std::vector<size_t> order(added.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t x, size_t y) { return added[x].content.size() > added[y].content.size(); });
    for (size_t i : order) added_by_first_byte[uint8_t(added[i].content[0])].push_back(i);
  }

  void load_normalizer(const json& n, const std::string& where) {
    const std::string type = type_of(n, origin + ": " + where);
    if (type == "Sequence") {
      size_t k = 0;
      for (const auto& s : n.at("normalizers")) load_normalizer(s, where + ".normalizers[" + std::to_string(k++) + "]");
    } else if (type == "NFC") {
      normalizers.push_back({NormStep::NFC, "", ""});
    } else if (type == "NFKC") {
      normalizers.push_back({NormStep::NFKC, "", ""});
    } else if (type == "Prepend") {
      normalizers.push_back({NormStep::Prepend, n.at("prepend").get<std::string>(), ""});
    } else if (type == "Replace") {
      bool literal = false;
      const std::string from = pattern_of(n.at("pattern"), origin + ": " + where, &literal);
      KBN_CHECK(literal, origin, ": ", where, ": a Replace normaliser with a regex pattern is not supported");
      normalizers.push_back({NormStep::Replace, from, n.at("content").get<std::string>()});
    } else {
      KBN_FAIL(origin, ": ", where, ": normaliser '", type,
               "' is not supported (supported: Sequence, NFC, NFKC, Prepend, Replace)");
    }
  }

  void load_pre(const json& p, const std::string& where) {
    const std::string type = type_of(p, origin + ": " + where);
    if (type == "Sequence") {
      size_t k = 0;
      for (const auto& s : p.at("pretokenizers")) load_pre(s, where + ".pretokenizers[" + std::to_string(k++) + "]");
    } else if (type == "Split") {
      KBN_CHECK(!p.value("invert", false), origin, ": ", where, ": an inverted Split is not supported");
      bool literal = false;
      const std::string pattern = pattern_of(p.at("pattern"), origin + ": " + where, &literal);
      PreStep s{PreStep::Split};
      s.regex = std::make_shared<Regex>(pattern, literal, origin + ": " + where);
      const std::string b = p.value("behavior", std::string("Isolated"));
      if (b == "Isolated") s.behavior = SplitBehavior::Isolated;
      else if (b == "Removed") s.behavior = SplitBehavior::Removed;
      else if (b == "MergedWithPrevious") s.behavior = SplitBehavior::MergedWithPrevious;
      else if (b == "MergedWithNext") s.behavior = SplitBehavior::MergedWithNext;
      else KBN_FAIL(origin, ": ", where, ": Split behavior '", b,
                    "' is not supported (Isolated, Removed, MergedWithPrevious, MergedWithNext)");
      pre.push_back(std::move(s));
    } else if (type == "ByteLevel") {
      if (p.value("use_regex", true)) {
        PreStep s{PreStep::Split};
        s.regex = std::make_shared<Regex>(gpt2_regex(), false, origin + ": " + where);
        pre.push_back(std::move(s));
      }
      PreStep s{PreStep::ByteLevel};
      s.add_prefix_space = p.value("add_prefix_space", false);
      pre.push_back(std::move(s));
    } else if (type == "Metaspace") {
      PreStep s{PreStep::Metaspace};
      s.replacement = p.value("replacement", std::string("\u2581"));
      s.prepend_scheme = p.value("prepend_scheme", std::string(p.value("add_prefix_space", true) ? "always" : "never"));
      KBN_CHECK(s.prepend_scheme == "always" || s.prepend_scheme == "first" || s.prepend_scheme == "never", origin,
                ": ", where, ": Metaspace prepend_scheme '", s.prepend_scheme, "' (expected always, first or never)");
      s.split = p.value("split", true);
      pre.push_back(std::move(s));
    } else {
      KBN_FAIL(origin, ": ", where, ": pre-tokenizer '", type,
               "' is not supported (supported: Sequence, Split, ByteLevel, Metaspace)");
    }
  }

  void load_decoder(const json& d, const std::string& where) {
    const std::string type = type_of(d, origin + ": " + where);
    if (type == "Sequence") {
      size_t k = 0;
      for (const auto& s : d.at("decoders")) load_decoder(s, where + ".decoders[" + std::to_string(k++) + "]");
    } else if (type == "ByteLevel") {
      decoders.push_back({DecodeStep::ByteLevel});
    } else if (type == "Replace") {
      bool literal = false;
      const std::string from = pattern_of(d.at("pattern"), origin + ": " + where, &literal);
      KBN_CHECK(literal, origin, ": ", where, ": a Replace decoder with a regex pattern is not supported");
      decoders.push_back({DecodeStep::Replace, from, d.at("content").get<std::string>()});
    } else if (type == "ByteFallback") {
      decoders.push_back({DecodeStep::ByteFallback});
    } else if (type == "Fuse") {
      decoders.push_back({DecodeStep::Fuse});
    } else if (type == "Strip") {
      DecodeStep s{DecodeStep::Strip, d.at("content").get<std::string>(), ""};
      s.start = d.value("start", size_t(0));
      s.stop = d.value("stop", size_t(0));
      decoders.push_back(s);
    } else if (type == "Metaspace") {
      DecodeStep s{DecodeStep::Metaspace, d.value("replacement", std::string("\u2581")), ""};
      const std::string scheme =
          d.value("prepend_scheme", std::string(d.value("add_prefix_space", true) ? "always" : "never"));
      s.prepend = scheme != "never";
      decoders.push_back(s);
    } else {
      KBN_FAIL(origin, ": ", where, ": decoder '", type,
               "' is not supported (supported: Sequence, ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace)");
    }
  }

  void load_post(const json& p, const std::string& where) {
    const std::string type = type_of(p, origin + ": " + where);
    if (type == "Sequence") {
      size_t k = 0;
      for (const auto& s : p.at("processors")) load_post(s, where + ".processors[" + std::to_string(k++) + "]");
    } else if (type == "ByteLevel") {
      // offsets only
    } else if (type == "TemplateProcessing") {
      const json& specials = p.at("special_tokens");
      bool seen_sequence = false;
      for (const auto& item : p.at("single")) {
        if (item.contains("Sequence")) {
          seen_sequence = true;
          continue;
        }
        KBN_CHECK(item.contains("SpecialToken"), origin, ": ", where, ".single: unexpected item ", item.dump());
        const std::string name = item.at("SpecialToken").at("id").get<std::string>();
        KBN_CHECK(specials.contains(name), origin, ": ", where, ".special_tokens has no '", name, "'");
        for (const auto& id : specials.at(name).at("ids"))
          (seen_sequence ? template_suffix : template_prefix).push_back(id.get<int32_t>());
      }
    } else {
      template_unsupported = type;
    }
  }

  // ---- encoding ----
  std::string normalize(std::string s) const {
    for (const auto& n : normalizers) {
      switch (n.kind) {
        case NormStep::NFC:
        case NormStep::NFKC: {
          utf8proc_uint8_t* out = n.kind == NormStep::NFC
                                      ? utf8proc_NFC(reinterpret_cast<const utf8proc_uint8_t*>(s.c_str()))
                                      : utf8proc_NFKC(reinterpret_cast<const utf8proc_uint8_t*>(s.c_str()));
          KBN_CHECK(out, "tokenizer: Unicode normalisation failed");
          s.assign(reinterpret_cast<const char*>(out));
          std::free(out);
          break;
        }
        case NormStep::Prepend:
          if (!s.empty()) s = n.a + s;
          break;
        case NormStep::Replace:
          replace_all(s, n.a, n.b);
          break;
      }
    }
    return s;
  }

  std::vector<Piece> pre_tokenize(std::vector<Piece> pieces) const {
    for (const auto& step : pre) {
      std::vector<Piece> next;
      for (auto& p : pieces) {
        switch (step.kind) {
          case PreStep::Split: split(p, step, next); break;
          case PreStep::ByteLevel: {
            std::string t = p.text;
            if (step.add_prefix_space && (t.empty() || t[0] != ' ')) t = " " + t;
            std::string mapped;
            for (unsigned char c : t) mapped += byte_map().to_char[c];
            next.push_back({std::move(mapped), p.at_start});
            break;
          }
          case PreStep::Metaspace: {
            std::string t = p.text;
            replace_all(t, " ", step.replacement);
            const bool prepend = step.prepend_scheme == "always" || (step.prepend_scheme == "first" && p.at_start);
            if (prepend && t.compare(0, step.replacement.size(), step.replacement) != 0) t = step.replacement + t;
            if (!step.split) {
              next.push_back({std::move(t), p.at_start});
              break;
            }
            // MergedWithNext on the replacement: each piece starts at a replacement character.
            size_t begin = 0;
            for (size_t i = step.replacement.size(); i <= t.size();) {
              const size_t j = t.find(step.replacement, i);
              const size_t end = j == std::string::npos ? t.size() : j;
              next.push_back({t.substr(begin, end - begin), p.at_start && begin == 0});
              if (j == std::string::npos) break;
              begin = end;
              i = end + step.replacement.size();
            }
            if (t.empty()) next.push_back({t, p.at_start});
            break;
          }
        }
      }
      std::erase_if(next, [](const Piece& x) { return x.text.empty(); });
      pieces = std::move(next);
    }
    return pieces;
  }

  static void split(const Piece& p, const PreStep& step, std::vector<Piece>& out) {
    const auto ms = step.regex->matches(p.text);
    std::vector<std::pair<size_t, size_t>> parts;  // [begin, end) in p.text
    size_t last = 0;
    std::vector<std::pair<std::pair<size_t, size_t>, bool>> seq;  // (range, is_match)
    for (const auto& m : ms) {
      if (m.first > last) seq.push_back({{last, m.first}, false});
      seq.push_back({m, true});
      last = m.second;
    }
    if (last < p.text.size()) seq.push_back({{last, p.text.size()}, false});
    switch (step.behavior) {
      case SplitBehavior::Isolated:
        for (const auto& [r, _] : seq) parts.push_back(r);
        break;
      case SplitBehavior::Removed:
        for (const auto& [r, is_match] : seq)
          if (!is_match) parts.push_back(r);
        break;
      case SplitBehavior::MergedWithPrevious:
        for (const auto& [r, is_match] : seq) {
          if (is_match && !parts.empty()) parts.back().second = r.second;
          else parts.push_back(r);
        }
        break;
      case SplitBehavior::MergedWithNext: {
        bool pending = false;
        for (const auto& [r, is_match] : seq) {
          if (pending) {
            parts.back().second = r.second;
            pending = is_match;
            continue;
          }
          parts.push_back(r);
          pending = is_match;
        }
        break;
      }
    }
    for (const auto& r : parts) out.push_back({p.text.substr(r.first, r.second - r.first), p.at_start && r.first == 0});
  }

  void bpe(const std::string& word, std::vector<int32_t>& out) const {
    if (ignore_merges) {
      const auto it = vocab.find(word);
      if (it != vocab.end()) {
        out.push_back(it->second);
        return;
      }
    }
    struct Sym {
      int32_t id;
      int32_t prev, next;  // -1 at the ends
      bool alive;
    };
    std::vector<Sym> syms;
    bool last_unk = false;
    for (size_t i = 0; i < word.size();) {
      const size_t n = std::min(char_len(uint8_t(word[i])), word.size() - i);
      const auto it = vocab.find(word.substr(i, n));
      if (it != vocab.end()) {
        syms.push_back({it->second, -1, -1, true});
        last_unk = false;
      } else {
        bool bytes_ok = byte_fallback;
        for (size_t k = 0; bytes_ok && k < n; ++k) bytes_ok = byte_tokens[uint8_t(word[i + k])] >= 0;
        if (bytes_ok) {
          for (size_t k = 0; k < n; ++k) syms.push_back({byte_tokens[uint8_t(word[i + k])], -1, -1, true});
          last_unk = false;
        } else {
          KBN_CHECK(unk_id >= 0, origin, ": the character '", word.substr(i, n),
                    "' is neither in the vocabulary nor covered by byte fallback, and there is no unk_token");
          if (!(fuse_unk && last_unk)) syms.push_back({unk_id, -1, -1, true});
          last_unk = true;
        }
      }
      i += n;
    }
    const int32_t count = int32_t(syms.size());
    for (int32_t i = 0; i < count; ++i) {
      syms[size_t(i)].prev = i - 1;
      syms[size_t(i)].next = i + 1 < count ? i + 1 : -1;
    }
    // Lowest rank first; among equal ranks the leftmost (as `tokenizers`' merge queue).
    using Entry = std::tuple<int32_t, int32_t, int32_t>;  // rank, left index, right index
    std::priority_queue<Entry, std::vector<Entry>, std::greater<>> queue;
    const auto push = [&](int32_t l) {
      if (l < 0) return;
      const int32_t r = syms[size_t(l)].next;
      if (r < 0) return;
      const uint64_t key = (uint64_t(uint32_t(syms[size_t(l)].id)) << 32) | uint32_t(syms[size_t(r)].id);
      const auto it = merges.find(key);
      if (it != merges.end()) queue.emplace(it->second.first, l, r);
    };
    for (int32_t i = 0; i + 1 < count; ++i) push(i);
    while (!queue.empty()) {
      const auto [rank, l, r] = queue.top();
      queue.pop();
      Sym& a = syms[size_t(l)];
      if (!a.alive || a.next != r || !syms[size_t(r)].alive) continue;
      const uint64_t key = (uint64_t(uint32_t(a.id)) << 32) | uint32_t(syms[size_t(r)].id);
      const auto it = merges.find(key);
      if (it == merges.end() || it->second.first != rank) continue;
      a.id = it->second.second;
      Sym& b = syms[size_t(r)];
      b.alive = false;
      a.next = b.next;
      if (b.next >= 0) syms[size_t(b.next)].prev = l;
      push(a.prev);
      push(l);
    }
    for (const auto& s : syms)
      if (s.alive) out.push_back(s.id);
  }

  void encode_segment(std::string_view segment, bool at_start, std::vector<int32_t>& out) const {
    if (segment.empty()) return;
    std::vector<Piece> pieces{{normalize(std::string(segment)), at_start}};
    if (pieces[0].text.empty()) return;
    for (const auto& p : pre_tokenize(std::move(pieces))) bpe(p.text, out);
  }

  // Added tokens out of the text first (leftmost, then longest), the rest through the pipeline.
  std::vector<int32_t> encode(std::string_view text) const {
    std::vector<int32_t> out;
    size_t seg = 0, i = 0;
    while (i < text.size()) {
      const AddedToken* hit = nullptr;
      for (size_t k : added_by_first_byte[uint8_t(text[i])]) {
        const auto& a = added[k];
        if (text.compare(i, a.content.size(), a.content) == 0) {
          hit = &a;
          break;
        }
      }
      if (!hit) {
        i += char_len(uint8_t(text[i]));
        continue;
      }
      size_t begin = i, end = i + hit->content.size();
      if (hit->lstrip)
        while (begin > seg && is_whitespace_cp(uint8_t(text[begin - 1]))) --begin;
      if (hit->rstrip) {
        while (end < text.size()) {
          const size_t n = char_len(uint8_t(text[end]));
          if (end + n > text.size() || !is_whitespace_cp(decode_char(text, end, n))) break;
          end += n;
        }
      }
      encode_segment(text.substr(seg, begin - seg), seg == 0, out);
      out.push_back(hit->id);
      seg = i = end;
    }
    encode_segment(text.substr(seg), seg == 0, out);
    return out;
  }

  // ---- decoding ----
  static bool byte_token(const std::string& t, uint8_t* b) {
    if (t.size() != 6 || t.compare(0, 3, "<0x") != 0 || t[5] != '>') return false;
    unsigned v = 0;
    for (int k = 3; k < 5; ++k) {
      const char c = t[size_t(k)];
      v <<= 4;
      if (c >= '0' && c <= '9') v |= unsigned(c - '0');
      else if (c >= 'A' && c <= 'F') v |= unsigned(c - 'A' + 10);
      else return false;
    }
    *b = uint8_t(v);
    return true;
  }

  std::string decode(std::span<const int32_t> ids, bool skip_special) const {
    std::vector<std::string> toks;
    for (const int32_t id : ids) {
      KBN_CHECK(id >= 0 && size_t(id) < has_id.size() && has_id[size_t(id)], origin, ": decode: no token has id ", id,
                " (vocabulary size ", id_to_tok.size(), ")");
      if (skip_special && special[size_t(id)]) continue;
      toks.push_back(id_to_tok[size_t(id)]);
    }
    for (const auto& d : decoders) {
      switch (d.kind) {
        case DecodeStep::ByteLevel: {
          std::string bytes;
          for (const auto& t : toks) {
            for (size_t i = 0; i < t.size();) {
              const size_t n = std::min(char_len(uint8_t(t[i])), t.size() - i);
              const auto it = byte_map().to_byte.find(decode_char(t, i, n));
              if (it != byte_map().to_byte.end()) bytes += char(it->second);
              else bytes.append(t, i, n);
              i += n;
            }
          }
          toks = {utf8_lossy(bytes)};
          break;
        }
        case DecodeStep::Replace:
          for (auto& t : toks) replace_all(t, d.a, d.b);
          break;
        case DecodeStep::ByteFallback: {
          std::vector<std::string> next;
          std::string pending;  // bytes of consecutive <0xXX> tokens
          size_t pending_count = 0;
          const auto flush = [&] {
            if (pending_count == 0) return;
            if (valid_utf8(pending)) {
              next.push_back(pending);
            } else {
              for (size_t k = 0; k < pending_count; ++k) next.emplace_back(kReplacementChar);
            }
            pending.clear();
            pending_count = 0;
          };
          for (auto& t : toks) {
            uint8_t b = 0;
            if (byte_token(t, &b)) {
              pending += char(b);
              ++pending_count;
            } else {
              flush();
              next.push_back(std::move(t));
            }
          }
          flush();
          toks = std::move(next);
          break;
        }
        case DecodeStep::Fuse: {
          std::string all;
          for (const auto& t : toks) all += t;
          toks = {std::move(all)};
          break;
        }
        case DecodeStep::Strip: {
          for (auto& t : toks) {
            size_t b = 0, e = t.size();
            for (size_t k = 0; k < d.start && t.compare(b, d.a.size(), d.a) == 0 && b < e; ++k) b += d.a.size();
            for (size_t k = 0; k < d.stop && e >= b + d.a.size() && t.compare(e - d.a.size(), d.a.size(), d.a) == 0;
                 ++k)
              e -= d.a.size();
            t = t.substr(b, e - b);
          }
          break;
        }
        case DecodeStep::Metaspace: {
          for (size_t k = 0; k < toks.size(); ++k) {
            replace_all(toks[k], d.a, " ");
            if (k == 0 && d.prepend && !toks[k].empty() && toks[k][0] == ' ') toks[k].erase(0, 1);
          }
          break;
        }
      }
    }
    std::string out;
    for (const auto& t : toks) out += t;
    return out;
  }
};

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Tokenizer Tokenizer::from_json_text(std::string_view json_text, const std::string& origin) {
  auto impl = std::make_unique<Impl>();
  impl->origin = origin;
  json j;
  try {
    j = json::parse(json_text);
  } catch (const json::exception& e) {
    KBN_FAIL(origin, ": not valid JSON (", e.what(), ")");
  }
  try {
    impl->load(j);
  } catch (const json::exception& e) {
    KBN_FAIL(origin, ": a field has an unexpected shape (", e.what(), ")");
  }
  return Tokenizer(std::move(impl));
}

Tokenizer Tokenizer::from_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  KBN_CHECK(in.good(), "tokenizer: cannot open '", path, "'");
  std::stringstream ss;
  ss << in.rdbuf();
  return from_json_text(ss.str(), path);
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  size_t bad = 0;
  KBN_CHECK(valid_utf8(text, &bad), "tokenizer: the text is not valid UTF-8 (first bad byte at offset ", bad, ")");
  std::vector<int32_t> ids = impl_->encode(text);
  if (!add_special_tokens) return ids;
  KBN_CHECK(impl_->template_unsupported.empty(), impl_->origin, ": post_processor '", impl_->template_unsupported,
            "' is not supported, so special tokens cannot be added (supported: TemplateProcessing, ByteLevel)");
  std::vector<int32_t> out = impl_->template_prefix;
  out.insert(out.end(), ids.begin(), ids.end());
  out.insert(out.end(), impl_->template_suffix.begin(), impl_->template_suffix.end());
  return out;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  return impl_->decode(ids, skip_special_tokens);
}

int64_t Tokenizer::vocab_size() const { return int64_t(impl_->id_to_tok.size()); }

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  const auto it = impl_->vocab.find(std::string(token));
  if (it == impl_->vocab.end()) return std::nullopt;
  return it->second;
}

std::optional<std::string> Tokenizer::id_to_token(int32_t id) const {
  if (id < 0 || size_t(id) >= impl_->has_id.size() || !impl_->has_id[size_t(id)]) return std::nullopt;
  return impl_->id_to_tok[size_t(id)];
}

bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && size_t(id) < impl_->special.size() && impl_->special[size_t(id)];
}

const std::vector<AddedToken>& Tokenizer::added_tokens() const { return impl_->added; }
const std::string& Tokenizer::origin() const { return impl_->origin; }

// ---- streaming ----

DecodeStream::DecodeStream(const Tokenizer& tok, bool skip_special_tokens) : tok_(&tok), skip_(skip_special_tokens) {}

DecodeStream::DecodeStream(const Tokenizer& tok, bool skip_special_tokens, std::span<const int32_t> prompt)
    : tok_(&tok), skip_(skip_special_tokens), ids_(prompt.begin(), prompt.end()) {
  // A few ids of context are enough for the decoders here (a leading-space strip, a split character). The text
  // counted as read ends at a character boundary: ids of a character the prompt leaves unfinished are read again,
  // so the character comes out whole with the token that finishes it.
  read_ = ids_.size();
  prefix_ = read_ > 8 ? read_ - 8 : 0;
  // A run of byte-fallback tokens (<0xXX>) decodes as one group, all of it U+FFFD while any character in it is
  // unfinished: the window starts where the run does, so the run's characters come out whole when it completes.
  auto is_byte_token = [&](int32_t id) {
    const std::optional<std::string> t = tok_->id_to_token(id);
    return t && t->size() == 6 && t->starts_with("<0x") && t->back() == '>';
  };
  while (prefix_ > 0 && is_byte_token(ids_[prefix_ - 1]) && is_byte_token(ids_[prefix_])) --prefix_;
  const std::span<const int32_t> all(ids_);
  std::string_view text;
  const std::string window = tok_->decode(all.subspan(prefix_, read_ - prefix_), skip_);
  if (!window.ends_with(kReplacementChar)) return;
  // The prompt's text stops inside a character: what comes before that character is context already, the
  // character comes out with the token that finishes it. The context is the window's text less its trailing
  // U+FFFDs, which can be shorter than the text of the ids read (byte fallback turns every byte of an unfinished
  // group into U+FFFD, a newline byte before the character included) or longer (a byte-level token ending in the
  // character's first bytes).
  text = window;
  while (text.ends_with(kReplacementChar)) text.remove_suffix(kReplacementChar.size());
  first_done_ = text.size();
  while (read_ > prefix_ && tok_->decode(all.subspan(prefix_, read_ - prefix_), skip_).ends_with(kReplacementChar))
    --read_;
}

std::string DecodeStream::push(int32_t id) {
  ids_.push_back(id);
  const std::span<const int32_t> all(ids_);
  const std::string before = tok_->decode(all.subspan(prefix_, read_ - prefix_), skip_);
  const std::string now = tok_->decode(all.subspan(prefix_), skip_);
  // Nothing yet while the newest character is unfinished (or the decoders changed the text before it).
  if (now.ends_with(kReplacementChar) || now.size() <= before.size() || now.compare(0, before.size(), before) != 0)
    return {};
  const size_t done = first_done_ == std::string::npos ? before.size() : first_done_;
  first_done_ = std::string::npos;
  if (now.size() <= done) return {};
  std::string out = now.substr(done);
  prefix_ = read_;
  read_ = ids_.size();  // a character boundary: `now` ends with a whole character
  return out;
}

std::string DecodeStream::flush() {
  const std::span<const int32_t> all(ids_);
  const std::string before = tok_->decode(all.subspan(prefix_, read_ - prefix_), skip_);
  const std::string now = tok_->decode(all.subspan(prefix_), skip_);
  const size_t done = first_done_ == std::string::npos ? before.size() : first_done_;
  prefix_ = read_ = ids_.size();
  first_done_ = std::string::npos;
  if (now.size() <= done || now.compare(0, before.size(), before) != 0) return {};
  return now.substr(done);
}

}  // namespace kbn::text
