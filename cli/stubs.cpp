// kb_nano stubs: writes candidate starting points into tasks/candidate/ of the checkout the working directory is in
// (or --dir): for each selected op, its baseline header and implementation, copied so that the candidate variant
// compiles and behaves exactly like the baseline, with a banner naming what the file replaces, the signatures it
// must keep, and where the kernel goes.
#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "cli/args.h"
#include "cli/commands.h"
#include "engine/model_loader.h"
#include "kbn/error.h"
#include "kbn/registry.h"

namespace kbn::cli {
namespace {

namespace fs = std::filesystem;

struct Options {
  int level = 0;
  std::string architecture;
  std::vector<std::string> targets;
  bool force = false;
  std::string dir;
};

// The checkout the stubs belong to: $KBN_SOURCE_DIR, else the folder at or above the working directory that holds
// tasks/baseline/ and CMakeLists.txt. Never silently the tree this binary was built from: a user in another
// checkout (a second worktree, a copy) would get files where they do not look.
fs::path checkout_root() {
  if (const char* env = std::getenv("KBN_SOURCE_DIR")) return env;
  const fs::path cwd = fs::current_path();
  for (fs::path p = cwd;; p = p.parent_path()) {
    if (fs::is_directory(p / "tasks" / "baseline") && fs::is_regular_file(p / "CMakeLists.txt")) return p;
    if (p == p.parent_path()) break;
  }
  KBN_FAIL("stubs: the working directory ", cwd.string(),
           " is not inside a kb-nano checkout (no folder at or above it holds tasks/baseline/ and CMakeLists.txt); "
           "cd into the checkout whose tasks/candidate/ should get the stubs, or set KBN_SOURCE_DIR to it");
}

// The source tree this binary was configured from ("" when unknown).
std::string built_from() {
#ifdef KBN_SOURCE_DIR
  return KBN_SOURCE_DIR;
#else
  return "";
#endif
}

std::string join(const std::vector<std::string>& v, const char* sep = ", ") {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : sep) + x;
  return s;
}

std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  KBN_CHECK(in.good(), "stubs: cannot read baseline file ", p.string());
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Task headers reachable from the L4 op serving `name`, an HF architecture ("LlamaForCausalLM") or a model
// name from models/ ("tiny-llama"), following the baseline include graph like `kb_nano list --map`.
std::set<std::string> headers_used_by(const std::string& name) {
  const Registry& reg = registry(Variant::baseline);
  std::string architecture = name;
  std::vector<std::string> models = engine::known_models();
  bool is_model = false;
  for (const auto& m : models) is_model = is_model || m == name;
  if (is_model) {
    auto archs = engine::resolve_model(name).config.architectures();
    KBN_CHECK(!archs.empty(), "--architecture: model '", name, "' names no architecture in its config");
    architecture = archs.front();
  }
  std::vector<std::string> known;
  for (const auto& e : reg.entries())
    for (const auto& a : e.architectures) {
      if (a == architecture) return include_graph(Variant::baseline).closure(e.header);
      known.push_back(a);
    }
  KBN_FAIL("--architecture: '", name, "' is neither an HF architecture served by an L4 op (", join(known),
           ") nor a model in ", engine::models_dir(), " (", join(models), ")",
           is_model ? "; that model's architecture '" + architecture + "' has no L4 op yet" : std::string());
}

std::vector<const OpEntry*> select_ops(const Options& o) {
  const Registry& reg = registry(Variant::baseline);
  std::vector<std::string> known;
  for (const auto& e : reg.entries()) known.push_back(e.name);
  for (const auto& t : o.targets) KBN_CHECK(reg.find(t), "--target: unknown op '", t, "'; known: ", join(known));
  std::set<std::string> used;
  if (!o.architecture.empty()) used = headers_used_by(o.architecture);

  std::vector<const OpEntry*> out;
  for (const auto& e : reg.entries()) {
    if (o.level && e.level != o.level) continue;
    if (!o.targets.empty() && std::find(o.targets.begin(), o.targets.end(), e.name) == o.targets.end()) continue;
    if (!o.architecture.empty() && !used.count(e.header)) continue;
    out.push_back(&e);
  }
  KBN_CHECK(!out.empty(), "stubs: no op matches", o.level ? " --level " + std::to_string(o.level) : "",
            o.targets.empty() ? "" : " --target " + join(o.targets, ","),
            o.architecture.empty() ? "" : " --architecture " + o.architecture, "; `kb_nano list` shows the ops");
  return out;
}

// ---- reading the baseline header: the classes and the declarations a candidate must keep ----

std::string strip_line_comments(const std::string& text) {
  std::string out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    size_t c = line.find("//");
    out += (c == std::string::npos ? line : line.substr(0, c)) + "\n";
  }
  return out;
}

std::string squeeze_spaces(const std::string& s) {
  std::string out;
  for (char ch : s) {
    bool space = ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r';
    if (space) {
      if (!out.empty() && out.back() != ' ') out += ' ';
    } else {
      out += ch;
    }
  }
  while (!out.empty() && out.back() == ' ') out.pop_back();
  return out;
}

bool is_ident_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

struct ClassDecl {
  std::string head;                       // "class RMSNorm : public Module"
  std::vector<std::string> declarations;  // constructors and forward overloads, one line each
};

// Each `class Name ... { ... };` of the header with its constructors and forward declarations.
std::vector<ClassDecl> classes_of(const std::string& header_text) {
  const std::string text = strip_line_comments(header_text);
  std::vector<ClassDecl> out;
  size_t pos = 0;
  while ((pos = text.find("class ", pos)) != std::string::npos) {
    size_t before = pos;
    while (before > 0 && std::isspace(static_cast<unsigned char>(text[before - 1]))) --before;
    const bool template_param = before > 0 && (text[before - 1] == '<' || text[before - 1] == ',');
    const bool enum_class = before >= 4 && text.compare(before - 4, 4, "enum") == 0;
    if ((pos > 0 && is_ident_char(text[pos - 1])) || template_param || enum_class) {
      pos += 6;
      continue;
    }
    size_t name_begin = pos + 6;
    size_t name_end = name_begin;
    while (name_end < text.size() && is_ident_char(text[name_end])) ++name_end;
    const std::string name = text.substr(name_begin, name_end - name_begin);
    size_t brace = text.find_first_of("{;", name_end);
    if (name.empty() || brace == std::string::npos || text[brace] == ';') {  // a forward declaration
      pos = name_end;
      continue;
    }
    ClassDecl c{squeeze_spaces(text.substr(pos, brace - pos)), {}};
    int depth = 1;
    int parens = 0;  // inside a parameter list, braces are default arguments, not a body
    std::string stmt;
    auto keep = [&](std::string s) {
      s = squeeze_spaces(s);
      for (const char* label : {"public:", "private:", "protected:"})
        for (size_t at; (at = s.find(label)) != std::string::npos;) s = squeeze_spaces(s.erase(at, std::strlen(label)));
      bool ctor = s.rfind(name + "(", 0) == 0 || s.rfind("explicit " + name + "(", 0) == 0;
      if (ctor || s.find(" forward(") != std::string::npos) c.declarations.push_back(s + ";");
    };
    size_t i = brace + 1;
    for (; i < text.size() && depth > 0; ++i) {
      char ch = text[i];
      if (depth == 1 && (parens > 0 || ch == '(' || ch == ')')) {
        parens += ch == '(' ? 1 : ch == ')' ? -1 : 0;
        stmt += ch;
      } else if (ch == '{') {
        if (depth == 1) {  // an inline body: the declaration ends here
          keep(stmt);
          stmt.clear();
        }
        ++depth;
      } else if (ch == '}') {
        --depth;
      } else if (depth == 1) {
        if (ch == ';') {
          keep(stmt);
          stmt.clear();
        } else {
          stmt += ch;
        }
      }
    }
    out.push_back(std::move(c));
    pos = i;
  }
  return out;
}

// ---- the stub files ----

struct StubFile {
  std::string rel;  // "L1/rms_norm.cu"
  std::string text;
};

const char* kMarker = "// >>> YOUR KERNEL HERE";

std::string banner(const std::string& rel, const std::vector<const OpEntry*>& ops,
                   const std::vector<ClassDecl>& classes, bool implementation) {
  std::vector<std::string> names;
  for (const auto* e : ops) names.push_back(e->name + " (" + e->class_name + ")");
  std::ostringstream b;
  b << "// ==== kb-nano candidate: " << rel << " ====\n"
    << "// Replaces tasks/baseline/" << rel << " in the candidate variant of the build (namespace kbn::candidate);\n"
    << "// the baseline variant keeps the baseline file. Generated by `kb_nano stubs` as a copy of the baseline,\n"
    << "// so it compiles as is and behaves exactly like the baseline until you change it.\n"
    << "// Ops: " << join(names) << ".\n"
    << "// Keep these classes and declarations exactly (tasks/registry.cpp checks them when the candidate\n"
    << "// variant compiles):\n";
  for (const auto& c : classes) {
    b << "//   " << c.head << "\n";
    for (const auto& d : c.declarations) b << "//     " << d << "\n";
  }
  if (implementation && ops.front()->level == 1)
    b << "// Put your kernel in each forward marked `" << kMarker << "`: replace the CUDA path;\n"
      << "// the CPU branch runs the reference oracle and may stay.\n";
  else if (implementation)
    b << "// Put your implementation in each forward marked `" << kMarker << "`; as generated it\n"
      << "// calls the lower-level ops it includes (a fused kernel may replace them; drop includes it no longer\n"
      << "// needs and `kb_nano list --candidates` shows which lower-level candidates that hides).\n";
  else
    b << "// Members, includes and private helpers may change; the header path and the declarations above may not.\n";
  b << "// ==== end of banner ====\n";
  return b.str();
}

// Marks each out-of-line `Class::forward(` definition (at column 0, so never a call) with kMarker.
std::string mark_forwards(const std::string& cu, int level) {
  const char* what =
      level == 1 ? "Replace the CUDA path of this body with your kernel" : "Replace this body with your implementation";
  std::istringstream in(cu);
  std::string out;
  for (std::string line; std::getline(in, line);) {
    size_t f = line.find("::forward(");
    if (f != std::string::npos && !line.empty() && line[0] != ' ' && line[0] != '\t' && line.rfind("//", 0) != 0) {
      size_t b = f;
      while (b > 0 && is_ident_char(line[b - 1])) --b;
      out += std::string(kMarker) + ": " + line.substr(b, f - b) + "::forward. " + what + "; keep the signature.\n";
    }
    out += line + "\n";
  }
  return out;
}

std::vector<StubFile> stubs_for_header(const std::string& header, const std::vector<const OpEntry*>& ops,
                                       const fs::path& baseline_dir) {
  const std::string h_text = read_text(baseline_dir / header);
  const std::vector<ClassDecl> classes = classes_of(h_text);
  std::vector<StubFile> out{{header, banner(header, ops, classes, false) + h_text}};
  const std::string cu = header.substr(0, header.rfind('.')) + ".cu";
  if (fs::exists(baseline_dir / cu))
    out.push_back(
        {cu, banner(cu, ops, classes, true) + mark_forwards(read_text(baseline_dir / cu), ops.front()->level)});
  return out;
}

void run(const Options& o) {
  const fs::path src = fs::absolute(checkout_root()).lexically_normal();
  const fs::path baseline_dir = src / "tasks" / "baseline";
  KBN_CHECK(fs::is_directory(baseline_dir), "stubs: no baseline tasks at ", baseline_dir.string(),
            "; set KBN_SOURCE_DIR to the kb-nano source tree");
  const bool default_dir = o.dir.empty();
  const fs::path dir = fs::absolute(default_dir ? src / "tasks" / "candidate" : fs::path(o.dir)).lexically_normal();

  std::map<std::string, std::vector<const OpEntry*>> by_header;  // ops sharing a header get one pair
  std::vector<std::string> order;
  for (const auto* e : select_ops(o)) {
    if (!by_header.count(e->header)) order.push_back(e->header);
    by_header[e->header].push_back(e);
  }

  int written = 0, skipped = 0;
  std::cout << "Candidate stubs in " << dir.string() << " (checkout " << src.string() << "):\n";
  for (const auto& header : order) {
    for (const auto& f : stubs_for_header(header, by_header[header], baseline_dir)) {
      const fs::path p = dir / f.rel;
      if (fs::exists(p) && !o.force) {
        std::cout << "  skipped " << f.rel << " (exists; --force overwrites it)\n";
        ++skipped;
        continue;
      }
      fs::create_directories(p.parent_path());
      std::ofstream out(p, std::ios::binary);
      out << f.text;
      KBN_CHECK(out.good(), "stubs: cannot write ", p.string());
      std::cout << "  wrote   " << f.rel << "\n";
      ++written;
    }
  }
  std::cout << written << " written, " << skipped << " skipped, in " << dir.string() << ".\n\n"
            << "Rebuild kb_nano before they take effect: candidates are compiled in, so no binary built before now "
               "runs them.\n";
  const std::string built = built_from();
  const bool same_tree = !built.empty() && fs::exists(built) && fs::equivalent(built, src);
  if (!same_tree)
    std::cout << "Note: this kb_nano was built from " << (built.empty() ? std::string("an unknown tree") : built)
              << ", not from " << src.string() << "; build that checkout to use them.\n";
  std::cout << "\nNext:\n  edit the bodies marked `" << kMarker << "` in the .cu files\n";
  if (default_dir) {
    std::cout << "  cd " << src.string()
              << " && scripts/kbn list --candidates    # rebuilds (CMake picks up new candidate files) and lists them\n"
              << "  scripts/kbn generate --variant candidate ...   # run the model on the candidate variant\n";
  } else {
    std::cout << "  cmake -S " << src.string() << " -B build-cand -DKBN_CANDIDATE_DIR=" << dir.string()
              << "\n  cmake --build build-cand --target kb_nano && build-cand/kb_nano list --candidates\n";
  }
}

}  // namespace

void add_stubs_command(CLI::App& app) {
  auto opts = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand(
      "stubs", "Write candidate files for the selected ops: copies of the baseline with the signatures to keep");
  cmd->add_option("--level", opts->level, "Only ops of this level (1..4)")->check(integer_in(1, 4, "a level 1..4"));
  cmd->add_option("--architecture", opts->architecture,
                  "Only ops used by this HF architecture (LlamaForCausalLM) or model name (tiny-llama)");
  cmd->add_option("--target", opts->targets, "Only these ops, by registry name (repeat or comma-separate)")
      ->delimiter(',');
  cmd->add_flag("--force", opts->force, "Overwrite existing candidate files");
  cmd->add_option("--dir", opts->dir,
                  "Write here instead of tasks/candidate/ of the checkout the working directory is in "
                  "($KBN_SOURCE_DIR overrides which checkout)");
  cmd->callback([opts] { run(*opts); });
}

}  // namespace kbn::cli
