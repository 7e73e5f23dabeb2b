#include "kbn/registry.h"

#include <algorithm>
#include <deque>

namespace kbn {

namespace {
std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}
}  // namespace

const char* variant_name(Variant v) { return v == Variant::baseline ? "baseline" : "candidate"; }

double OpArgs::get(const std::string& key) const {
  auto it = values.find(key);
  KBN_CHECK(it != values.end(), op, ": missing constructor argument '", key, "'");
  return it->second;
}

int64_t OpArgs::get_int(const std::string& key) const {
  double v = get(key);
  KBN_CHECK(v == double(int64_t(v)), op, ": constructor argument '", key, "' must be an integer, got ", v);
  return int64_t(v);
}

const ModelConfig& OpArgs::model_config() const {
  KBN_CHECK(config != nullptr, op, ": needs a model config (OpArgs::config) to build");
  return *config;
}

double OpArgs::get(const std::string& key, double fallback) const {
  auto it = values.find(key);
  return it == values.end() ? fallback : it->second;
}

int64_t OpArgs::get_int_or(const std::string& key, int64_t fallback) const {
  return values.count(key) ? get_int(key) : fallback;
}

void Registry::add(OpEntry e) {
  e.source = source_;
  if (const OpEntry* prev = find(e.name))
    KBN_FAIL("registry: op '", e.name, "' is registered twice: by ", prev->source, " and by ", e.source,
             "; every op name belongs to one facts file");
  KBN_CHECK(!e.name.empty() && !e.header.empty() && e.make, "registry: ", e.source,
            ": an entry needs a name, a header and a make function (got name '", e.name, "')");
  KBN_CHECK(e.level >= 1 && e.level <= 4, "registry: ", e.source, ": op '", e.name, "' has level ", e.level,
            "; expected 1..4");
  for (const auto& m : e.mutates)
    KBN_CHECK(std::find(e.args.begin(), e.args.end(), m) != e.args.end(), "registry: ", e.source, ": op '",
              e.name, "' declares that it mutates '", m, "', which is not one of its arguments (", join(e.args),
              ")");
  KBN_CHECK(e.level == 4 || (e.architectures.empty() && !e.make_model), "registry: ", e.source, ": op '", e.name,
            "' serves architectures but is not an L4 model");
  entries_.push_back(std::move(e));
}

const OpEntry* Registry::find(std::string_view name) const {
  for (const auto& e : entries_)
    if (e.name == name) return &e;
  return nullptr;
}

const OpEntry& Registry::get(std::string_view name) const {
  if (const OpEntry* e = find(name)) return *e;
  std::string known;
  for (const auto& e : entries_) known += (known.empty() ? "" : ", ") + e.name;
  KBN_FAIL("unknown op '", std::string(name), "'; known ops: ", known);
}

const OpEntry* Registry::find_model_for(const std::string& architecture) const {
  for (const auto& e : entries_)
    for (const auto& a : e.architectures)
      if (a == architecture) return &e;
  return nullptr;
}

std::vector<std::string> Registry::architectures_of(const ModelConfig& config) const {
  std::vector<std::string> archs = config.architectures();
  if (!archs.empty() || !config.has("model_type")) return archs;
  const std::string type = config.get_string("model_type");
  for (const auto& e : entries_)
    for (const auto& [t, arch] : e.model_types)
      if (t == type) return {arch};
  return archs;
}

const OpEntry& Registry::model_for(const std::string& architecture) const {
  if (const OpEntry* e = find_model_for(architecture)) return *e;
  std::string known;
  for (const auto& e : entries_)
    for (const auto& a : e.architectures) known += (known.empty() ? "" : ", ") + a;
  KBN_FAIL("no L4 model serves architecture '", architecture, "'; supported: ", known);
}

std::set<std::string> IncludeGraph::closure(const std::string& root) const {
  std::set<std::string> seen;
  std::deque<std::string> todo{root};
  while (!todo.empty()) {
    std::string f = todo.front();
    todo.pop_front();
    if (!seen.insert(f).second) continue;
    auto it = edges.find(f);
    if (it != edges.end())
      for (const auto& inc : it->second) todo.push_back(inc);
    // A header's implementation file belongs to it.
    if (f.size() > 2 && f.substr(f.size() - 2) == ".h") {
      std::string impl = f.substr(0, f.size() - 2) + ".cu";
      if (edges.count(impl)) todo.push_back(impl);
    }
  }
  return seen;
}

}  // namespace kbn
