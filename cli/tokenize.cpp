// kb_nano tokenize: a model's tokenizer on the command line (as llama.cpp's llama-tokenize): the ids of a text, with
// each token's string, or the text of ids.
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <iostream>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/args.h"
#include "cli/commands.h"
#include "engine/model_loader.h"
#include "text/chat.h"
#include "text/tokenizer.h"

namespace kbn::cli {
namespace {

struct Options {
  std::string model;
  std::string tokenizer;
  std::string text;
  std::string decode;
  bool no_special = false;
  bool chat = false;
  bool json = false;
};

void run(const Options& o) {
  KBN_CHECK(o.text.empty() != o.decode.empty(), "--text and --decode: give one of the two");
  std::string path = o.tokenizer;
  if (path.empty()) {
    KBN_CHECK(!o.model.empty(), "--tokenizer: give a tokenizer.json, or --model whose folder holds one");
    path = engine::resolve_model(o.model).tokenizer_path;
    KBN_CHECK(!path.empty(), "--model: ", o.model, " has no tokenizer.json (pass --tokenizer)");
  }
  KBN_CHECK(std::filesystem::is_regular_file(path), "--tokenizer: '", path, "' is not a file");
  const text::Tokenizer tok = text::Tokenizer::from_file(path);
  if (!o.decode.empty()) {
    std::vector<int32_t> ids;
    std::stringstream ss(o.decode);
    std::string part;
    while (std::getline(ss, part, ',')) {
      size_t used = 0;
      long long v = -1;
      try {
        v = std::stoll(part, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      KBN_CHECK(used == part.size() && !part.empty() && v >= 0 && v <= INT32_MAX,
                "--decode: expected comma-separated token ids like 9906,1917, got '", o.decode, "'");
      ids.push_back(int32_t(v));
    }
    std::cout << tok.decode(ids, o.no_special) << "\n";
    return;
  }
  std::string t = o.text;
  if (t == "-") t.assign(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
  KBN_CHECK(text::valid_utf8(t), "--text: not valid UTF-8");
  if (o.chat) {
    const std::string folder = std::filesystem::path(path).parent_path().string();
    t = text::ChatTemplate::for_folder(folder.empty() ? "." : folder, tok).render({{"user", t}});
  }
  const std::vector<int32_t> ids = tok.encode(t, !o.no_special && !o.chat);
  if (o.json) {
    std::cout << nlohmann::json(ids).dump() << "\n";
    return;
  }
  for (int32_t id : ids) {
    const std::string piece = tok.decode(std::vector<int32_t>{id}, false);
    std::cout << id << "\t" << nlohmann::json(*tok.id_to_token(id)).dump() << "\t" << nlohmann::json(piece).dump()
              << (tok.is_special(id) ? "\tspecial" : "") << "\n";
  }
  std::fprintf(stderr, "%zu tokens\n", ids.size());
}

}  // namespace

void add_tokenize_command(CLI::App& app) {
  auto o = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand("tokenize",
                                     "A model's tokenizer: the ids of a text (one line per token: id, token, its "
                                     "text), or the text of ids");
  cmd->add_option("--model", o->model, "Model name, config or folder whose tokenizer.json to use");
  cmd->add_option("--tokenizer", o->tokenizer, "A Hugging Face tokenizer.json");
  cmd->add_option("--text", o->text, "Text to encode ('-' reads stdin)");
  cmd->add_option("--decode", o->decode, "Comma-separated ids to decode");
  cmd->add_flag("--no-special", o->no_special,
                "Encode without the post-processor's special tokens (BOS); decode skipping special tokens");
  cmd->add_flag("--chat", o->chat, "Encode the text as a user message in the model's chat format");
  cmd->add_flag("--json", o->json, "Print the ids as one JSON list");
  cmd->callback([o] { run(*o); });
}

}  // namespace kbn::cli
