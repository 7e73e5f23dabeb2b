#pragma once
// Every task source is compiled once per variant: with -DKBN_VARIANT=baseline into namespace
// kbn::baseline, and (when tasks/candidate/ holds files) with -DKBN_VARIANT=candidate into kbn::candidate,
// where a file in tasks/candidate/ replaces its twin in tasks/baseline/ at the same relative path.
#ifndef KBN_VARIANT
#error "task sources are compiled per variant: define KBN_VARIANT=baseline or KBN_VARIANT=candidate"
#endif

#include "kbn/module.h"
#include "kbn/tensor.h"

#define KBN_STRINGIFY_(x) #x
#define KBN_STRINGIFY(x) KBN_STRINGIFY_(x)
#define KBN_VARIANT_NAME KBN_STRINGIFY(KBN_VARIANT)

// In the candidate variant, KBN_CANDIDATE_REPLACES_<path> is defined for each file of tasks/candidate/, the path as a
// C identifier (L1/rms_norm.cu -> KBN_CANDIDATE_REPLACES_L1_rms_norm_cu; cmake/KbnTasks.cmake). A task file that
// folds other ops' work into a fused kernel (LlamaDecoderLayer's one-token norm + GEMV) tests them and keeps the
// separate calls when one of those ops is a candidate: a candidate is reached wherever the baseline runs its op.
