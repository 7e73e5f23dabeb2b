#pragma once
// The op registry (after CUTLASS's Operation table): every task registers by name with its level, class,
// header, forward arguments, the arguments it mutates (vLLM's Tensor!), the kernels that are its work in a
// trace, and its test facts (cases from any model view, bytes and FLOPs, tolerance). Each op's entry is
// written in one file, tasks/ops/L<n>/<name>.cpp, which a candidate cannot shadow; a generated unit calls
// every such file's registration (no central list). The CLI, the kernel bench and the engine look ops up
// by name.
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kbn/causal_lm.h"
#include "kbn/compare.h"
#include "kbn/config.h"
#include "kbn/model_view.h"
#include "kbn/module.h"
#include "kbn/op_args.h"
#include "kbn/op_case.h"

namespace kbn {

enum class Variant { baseline, candidate };
const char* variant_name(Variant v);

struct OpEntry {
  std::string name;        // registry name, e.g. "rms_norm"
  std::string class_name;  // "RMSNorm"
  int level = 1;
  std::string header;                  // relative to tasks/<variant>/, e.g. "L1/rms_norm.h"
  std::vector<std::string> ctor_args;  // names read from OpArgs
  std::vector<std::string> args;       // forward's tensor arguments, in order
  std::vector<std::string> mutates;    // the subset of args written in place
  std::function<std::unique_ptr<AnyOp>(const OpArgs&)> make;
  // L4 only: the HF architectures served, the model factory, and the features its ops' facts may ask the
  // model view for (ModelView::features, e.g. "qk_norm").
  std::vector<std::string> architectures;
  // HF model_type -> the architecture above that transformers' Auto classes build for it, for configs that name no
  // 'architectures' (the published Gemma-3-12B-it config names none; its model_type "gemma3").
  std::vector<std::pair<std::string, std::string>> model_types;
  std::function<std::unique_ptr<CausalLM>(const ModelConfig&, const ParamOptions&)> make_model;
  std::vector<std::string> features;
  // Substrings of the names of the kernels that do this op's work (kernel traces attribute GPU time by the
  // longest one a kernel name contains; several ops may share one, e.g. a fallback kernel).
  std::vector<std::string> kernels;
  // Test facts: the cases of this op for one rank of a model (none when the model lacks what the op
  // needs). Unset: the op is registered but not benchmarked on its own (it needs a process group).
  std::function<std::vector<BenchCase>(const ModelView&, const CaseOptions&)> cases;
  // The engine runs this op around every model (the sampler), so every model's op list holds it although no
  // L4 includes it.
  bool every_model = false;
  // Validation: outputs must equal the baseline's and the oracle's exactly (copies, gathers, integer
  // results) rather than within the dtype's tolerance.
  bool exact_outputs = false;
  // Arguments whose values have a domain the validator's large / outliers / sparse input distributions would leave
  // (Mamba-2's A, which must stay negative, and its time-step bias): those distributions keep them as the case made
  // them.
  std::vector<std::string> fixed_inputs;
  // The op computes MoE router logits from its inputs and routes on them through topk_softmax (a MoE block with its
  // gate, or a layer holding one): where its outputs disagree with the baseline's or the oracle's, validation asks the
  // oracle which tokens' routing is a near-tie of the rounded logits (reference::RoutingTieLog) and compares again
  // with those tokens' rows taken as equal (bench/validate.h). Ops given the logits as an input route identically
  // on both sides and must not set it.
  bool router_inside = false;
  // Validation tolerance per dtype when the default (two ulps of the output type) does not fit the op.
  std::function<Tolerance(DType)> tolerance;
  // The facts file that registered this entry (set by the registry), for error messages.
  std::string source;
};

class Registry {
 public:
  // Refuses a second entry of the same name, naming both facts files.
  void add(OpEntry e);
  // The facts file whose registration runs next (the generated register-all unit sets it).
  void set_source(std::string file) { source_ = std::move(file); }
  const OpEntry* find(std::string_view name) const;
  const OpEntry& get(std::string_view name) const;  // the error lists the known names
  const std::vector<OpEntry>& entries() const { return entries_; }
  // The L4 entry serving an HF architecture name ("LlamaForCausalLM").
  const OpEntry& model_for(const std::string& architecture) const;
  // The L4 entry serving `architecture`, or nullptr (an architecture whose ops exist before its model does).
  const OpEntry* find_model_for(const std::string& architecture) const;
  // The config's 'architectures', or when it names none, the architecture an L4 entry declares for its model_type
  // (OpEntry::model_types); empty when neither gives one.
  std::vector<std::string> architectures_of(const ModelConfig& config) const;

 private:
  std::vector<OpEntry> entries_;
  std::string source_;
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
