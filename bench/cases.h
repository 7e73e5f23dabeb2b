#pragma once
// The cases `kb_nano kernels` runs: each op's own test facts (OpEntry::cases, written in its facts file under
// tasks/ops/) applied to one rank's view of a model, plus property-based random shapes. This file holds no
// per-op knowledge: which ops a model runs comes from the include closure of its L4 entry.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kbn/config.h"
#include "kbn/model_view.h"
#include "kbn/op_case.h"
#include "kbn/registry.h"

namespace kbn::bench {

using kbn::BenchCase;
using kbn::CaseOptions;
using kbn::StepContext;

// The view of `config` for one rank of `tp`, with the features of the L4 entry serving its architecture
// (the error names the architecture and the ones served).
ModelView model_view(const std::string& name, const ModelConfig& config, int64_t tp);

// The benchmarked ops of level `level` that the model's L4 reaches through its includes (what `kb_nano list
// --map` shows) and the ops the engine runs around every model (the sampler), in registration order; ops
// without test facts (all_reduce) are left out.
std::vector<std::string> model_ops(const ModelView& m, int level);

// Cases of `op` for the view. Errors name the flag (--target, --tp, --tokens) and what was expected. Empty
// when the model lacks what the op needs.
std::vector<BenchCase> cases_for(const std::string& op, const ModelView& m, const CaseOptions& options);

// Property-based shapes: `count` random configs derived from `like` (odd hidden and intermediate sizes, 1..16
// query heads per kv head, head size 64 or 128, vocabularies that are not multiples of 64), each with one random
// token count, all drawn from `seed`, through the op's own facts. Labels start with "random#i". `small` keeps
// them cheap enough for CPU ops and the CPU oracle.
std::vector<BenchCase> random_cases(const std::string& op, const ModelView& like, int count, uint64_t seed,
                                    bool small, DType dtype, std::optional<DType> kv_cache_dtype = std::nullopt);

// Builds `entry`'s op for case `c` on `device` with the case's dtype and seeded weights N(0, 0.02) (same seed:
// same weights for every variant and device); an op with a step context runs every call under it.
std::unique_ptr<AnyOp> build_case_op(const OpEntry& entry, const BenchCase& c, Device device, uint64_t seed);

// One line per case: op, model, tp, label, bytes, FLOPs (what `kb_nano kernels --list` prints).
std::string format_case_list(const std::vector<BenchCase>& cases);

}  // namespace kbn::bench
