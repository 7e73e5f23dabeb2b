#pragma once
// Argument checks for the op layer. Each failure says which op, which argument, what was expected and
// what arrived, e.g. "rms_norm: argument 'x' must be 2-D [num_tokens, hidden_size], got bf16[4] cpu".
#include <initializer_list>
#include <string>

#include "kbn/tensor.h"

namespace kbn {

void check_defined(const Tensor& t, const char* op, const char* arg);
// The tensor lives in host memory (the reference oracle runs on the CPU).
void check_cpu(const Tensor& t, const char* op, const char* arg);
// `layout` describes the dimensions, e.g. "[num_tokens, hidden_size]".
void check_rank(const Tensor& t, const char* op, const char* arg, int64_t rank, const char* layout);
void check_dtype(const Tensor& t, const char* op, const char* arg, std::initializer_list<DType> allowed);
void check_same_dtype(const Tensor& a, const Tensor& b, const char* op, const char* arg_a, const char* arg_b);
void check_same_device(const Tensor& a, const Tensor& b, const char* op, const char* arg_a, const char* arg_b);
void check_contiguous(const Tensor& t, const char* op, const char* arg);
// Last dimension has stride 1 (rows may be strided).
void check_last_dim_contiguous(const Tensor& t, const char* op, const char* arg);
void check_size(const Tensor& t, const char* op, const char* arg, int64_t dim, int64_t expected, const char* what);
// Data pointer and every non-unit stride aligned to `bytes` (for vectorised kernels).
void check_aligned(const Tensor& t, const char* op, const char* arg, size_t bytes);
// A CPU tensor of state-slot indices (one per sequence): each in [0, num_slots) and no slot twice (two sequences
// writing one slot would corrupt both). The error names `arg`, the entry and the slot.
void check_distinct_slots(const Tensor& indices, const char* op, const char* arg, int64_t num_slots);

}  // namespace kbn
