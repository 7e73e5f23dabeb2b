#pragma once
// The op registry (after CUTLASS's Operation table): every task registers by name with its level, class,
// header, forward arguments and the arguments it mutates (vLLM's Tensor!). Baseline and candidate variants
// register the same way; the CLI, the kernel bench and the engine look ops up by name.
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "kbn/causal_lm.h"
#include "kbn/config.h"
#include "kbn/module.h"

namespace kbn {

enum class Variant { baseline, candidate };
const char* variant_name(Variant v);

// Constructor arguments by name, for building an op from a model config or a bench case.
struct OpArgs {
  std::string op;  // for error messages
  std::map<std::string, double> values;
  ParamOptions opts;
  const ModelConfig* config = nullptr;  // L2..L4 ops build from a model config

  const ModelConfig& model_config() const;

  double get(const std::string& key) const;
  int64_t get_int(const std::string& key) const;
  double get(const std::string& key, double fallback) const;
  int64_t get_int_or(const std::string& key, int64_t fallback) const;
};

// A built op with a uniform calling convention: tensors in the order of OpEntry::args, outputs returned
// (for in-place ops, the mutated tensors).
class AnyOp {
 public:
  virtual ~AnyOp() = default;
  virtual Module& module() = 0;
  virtual std::vector<Tensor> call(const std::vector<Tensor>& args) = 0;
};

struct OpEntry {
  std::string name;        // registry name, e.g. "rms_norm"
  std::string class_name;  // "RMSNorm"
  int level = 1;
  std::string header;                  // relative to tasks/<variant>/, e.g. "L1/rms_norm.h"
  std::vector<std::string> ctor_args;  // names read from OpArgs
  std::vector<std::string> args;       // forward's tensor arguments, in order
  std::vector<std::string> mutates;    // the subset of args written in place
  std::function<std::unique_ptr<AnyOp>(const OpArgs&)> make;
  // L4 only: the HF architectures served and the model factory.
  std::vector<std::string> architectures;
  std::function<std::unique_ptr<CausalLM>(const ModelConfig&, const ParamOptions&)> make_model;
  // Validation: outputs must equal the baseline's and the oracle's exactly (copies, gathers, integer
  // results) rather than within the dtype's tolerance.
  bool exact_outputs = false;
};

class Registry {
 public:
  void add(OpEntry e);
  const OpEntry* find(std::string_view name) const;
  const OpEntry& get(std::string_view name) const;  // the error lists the known names
  const std::vector<OpEntry>& entries() const { return entries_; }
  // The L4 entry serving an HF architecture name ("LlamaForCausalLM").
  const OpEntry& model_for(const std::string& architecture) const;

 private:
  std::vector<OpEntry> entries_;
};

const Registry& registry(Variant v);
// True when this binary compiled a candidate variant (tasks/candidate/ held task files at build time).
bool candidate_built();
// Relative paths of the candidate files compiled in (e.g. "L1/rms_norm.cu").
const std::vector<std::string>& candidate_files();

// #include edges between task files, read from the sources at build time, per variant (the candidate
// graph reflects the candidate files' own includes).
struct IncludeGraph {
  std::map<std::string, std::vector<std::string>> edges;  // "L3/llama_decoder_layer.cu" -> {"L1/rms_norm.h", ...}
  // Every task file reachable from `root`, following includes and each header's implementation file.
  std::set<std::string> closure(const std::string& root) const;
};
const IncludeGraph& include_graph(Variant v);

}  // namespace kbn
