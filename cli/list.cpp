// kb_nano list: the ops by level, which models use them (from the real include graph), and candidates.
#include <algorithm>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>

#include "cli/args.h"
#include "cli/commands.h"
#include "engine/model_loader.h"
#include "kbn/registry.h"

namespace kbn::cli {
namespace {

struct Options {
  bool map = false;
  bool candidates = false;
  int level = 0;
  bool json = false;
};

// model name -> ops it uses, per variant's include graph.
std::map<std::string, std::vector<std::string>> ops_by_model(Variant v) {
  std::map<std::string, std::vector<std::string>> out;
  const Registry& reg = registry(v);
  const IncludeGraph& g = include_graph(v);
  for (const auto& model : engine::known_models()) {
    auto archs = engine::resolve_model(model).config.architectures();
    const OpEntry* l4 = nullptr;
    for (const auto& e : reg.entries())
      for (const auto& a : e.architectures)
        if (!archs.empty() && a == archs.front()) l4 = &e;
    if (!l4) continue;  // an architecture kb-nano does not implement yet
    std::set<std::string> files = g.closure(l4->header);
    // The ops the model's L4 includes, and those the engine runs around every model (the sampler).
    for (const auto& e : reg.entries())
      if (files.count(e.header) || e.every_model) out[model].push_back(e.name);
  }
  return out;
}

// Ops whose include closure contains `file` (a task file path like "L1/rms_norm.cu").
std::vector<std::string> ops_affected_by(const std::string& file, Variant v) {
  std::vector<std::string> out;
  std::string header = file.substr(0, file.rfind('.')) + ".h";
  for (const auto& e : registry(v).entries()) {
    auto c = include_graph(v).closure(e.header);
    if (c.count(file) || c.count(header)) out.push_back(e.name);
  }
  return out;
}

std::string join(const std::vector<std::string>& v, const char* sep = ", ") {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : sep) + x;
  return s;
}

// Where a candidate file stops being used: an op whose baseline include closure reaches `file` but whose
// candidate closure does not, because higher-level candidate files dropped the includes leading to it.
struct Hiding {
  const OpEntry* op;
  std::vector<std::string> by;  // candidate files on the baseline path that no longer include the next step
};

// True when `file`, or the header whose implementation it is, lies in `closure`.
bool reaches(const std::set<std::string>& closure, const std::string& file) {
  std::string header = file.substr(0, file.rfind('.')) + ".h";
  return closure.count(file) || closure.count(header);
}

std::vector<Hiding> hidings_of(const std::string& file) {
  const IncludeGraph& base = include_graph(Variant::baseline);
  const IncludeGraph& cand = include_graph(Variant::candidate);
  auto edges = [](const IncludeGraph& g, const std::string& f) {
    auto it = g.edges.find(f);
    return it == g.edges.end() ? std::vector<std::string>{} : it->second;
  };
  std::vector<Hiding> out;
  for (const auto& e : registry(Variant::baseline).entries()) {
    const std::set<std::string> base_closure = base.closure(e.header);
    if (!reaches(base_closure, file) || reaches(cand.closure(e.header), file)) continue;
    Hiding h{&e, {}};
    for (const auto& c : candidate_files()) {
      if (c == file || !base_closure.count(c)) continue;
      // c hides `file` when a baseline include of c led to it and c's candidate twin dropped that include.
      const std::vector<std::string> now = edges(cand, c);
      for (const auto& inc : edges(base, c))
        if (reaches(base.closure(inc), file) && std::find(now.begin(), now.end(), inc) == now.end()) {
          h.by.push_back("tasks/candidate/" + c);
          break;
        }
    }
    out.push_back(std::move(h));
  }
  return out;
}

void print_candidates() {
  std::cout << "Candidate files compiled in, and the ops they change:\n";
  for (const auto& f : candidate_files()) {
    std::cout << "  tasks/candidate/" << f << " -> " << join(ops_affected_by(f, Variant::candidate)) << "\n";
    std::vector<std::string> l4_reached;
    bool l4_hidden = false;
    for (const auto& e : registry(Variant::candidate).entries())
      if (e.level == 4 && reaches(include_graph(Variant::candidate).closure(e.header), f)) l4_reached.push_back(e.name);
    for (const auto& h : hidings_of(f)) {
      l4_hidden = l4_hidden || h.op->level == 4;
      std::cout << "      hidden from " << h.op->name << " (L" << h.op->level << ") by "
                << (h.by.empty() ? "candidate files that no longer include it" : join(h.by))
                << ": that op no longer includes this file, so this candidate does not run there\n";
    }
    if (!l4_reached.empty())
      std::cout << "      reaches L4: " << join(l4_reached) << "\n";
    else if (l4_hidden)
      std::cout << "      HIDDEN: no L4 model runs this candidate any more\n";
    else
      std::cout << "      reaches no L4 model (nor did its baseline twin)\n";
  }
}

void run(const Options& o) {
  const Registry& reg = registry(Variant::baseline);
  auto by_model = ops_by_model(Variant::baseline);
  std::map<std::string, std::vector<std::string>> by_op;
  for (const auto& [m, ops] : by_model)
    for (const auto& op : ops) by_op[op].push_back(m);

  if (o.json) {
    nlohmann::json j;
    for (const auto& e : reg.entries()) {
      if (o.level && e.level != o.level) continue;
      j["ops"].push_back({{"name", e.name},
                          {"class", e.class_name},
                          {"level", e.level},
                          {"header", e.header},
                          {"args", e.args},
                          {"mutates", e.mutates},
                          {"models", by_op[e.name]}});
    }
    j["models"] = by_model;
    j["candidate_files"] = candidate_files();
    for (const auto& f : candidate_files())
      for (const auto& h : hidings_of(f))
        j["candidate_hidden"][f].push_back({{"op", h.op->name}, {"level", h.op->level}, {"by", h.by}});
    std::cout << j.dump(2) << "\n";
    return;
  }

  if (o.map) {
    std::cout << "Operators by model (from the include graph of tasks/baseline):\n";
    for (const auto& [m, ops] : by_model) std::cout << "  " << m << ": " << join(ops) << "\n";
    std::cout << "\nModels by operator:\n";
    for (const auto& e : reg.entries()) {
      if (o.level && e.level != o.level) continue;
      std::cout << "  " << e.name << ": " << (by_op[e.name].empty() ? "(no model)" : join(by_op[e.name])) << "\n";
    }
    return;
  }

  if (o.candidates) {
    if (candidate_files().empty()) {
      std::cout << "No candidate compiled in (tasks/candidate/ held no task files when kb_nano was built).\n";
      return;
    }
    print_candidates();
    return;
  }

  for (int level = 1; level <= 4; ++level) {
    if (o.level && level != o.level) continue;
    std::cout << "L" << level << ":\n";
    for (const auto& e : reg.entries()) {
      if (e.level != level) continue;
      std::cout << "  " << e.name << "  (" << e.class_name << ", " << e.header << ")";
      if (!e.mutates.empty()) std::cout << "  mutates: " << join(e.mutates);
      std::cout << "\n      used by: " << (by_op[e.name].empty() ? "(no model)" : join(by_op[e.name])) << "\n";
    }
  }
  if (!candidate_files().empty()) std::cout << "\nCandidates compiled in: " << join(candidate_files()) << "\n";
}

}  // namespace

void add_list_command(CLI::App& app) {
  auto opts = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand("list", "List the ops by level, the models that use them, and candidates");
  cmd->add_flag("--map", opts->map, "Operators by model and models by operator, from the include graph");
  cmd->add_flag("--candidates", opts->candidates, "Candidate files compiled in and the ops each changes");
  cmd->add_option("--level", opts->level, "Only this level (1..4)")->check(integer_in(1, 4, "a level 1..4"));
  cmd->add_flag("--json", opts->json, "Machine-readable output");
  cmd->callback([opts] { run(*opts); });
}

}  // namespace kbn::cli
