#include "engine/cuda_graph_runner.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "kbn/allocator.h"
#include "kbn/cuda_ops.h"
#include "kbn/step_metadata.h"
#ifdef KBN_WITH_CUDA
#include "kbn/cuda_check.h"
#endif

namespace kbn::engine {

namespace {
constexpr int64_t kMaxCaptureSize = 512;  // vLLM's default largest capture size
}  // namespace

std::vector<int64_t> cuda_graph_capture_sizes(int64_t max_num_seqs, int64_t max_num_batched_tokens) {
  KBN_CHECK(max_num_seqs >= 1 && max_num_batched_tokens >= 1,
            "cuda_graph_capture_sizes: max_num_seqs and max_num_batched_tokens must be >= 1, got ", max_num_seqs,
            " and ", max_num_batched_tokens);
  const int64_t cap = std::min({max_num_seqs, max_num_batched_tokens, kMaxCaptureSize});
  std::vector<int64_t> sizes;
  for (int64_t s : {1, 2, 4})
    if (s <= cap) sizes.push_back(s);
  for (int64_t s = 8; s <= cap; s += 8) sizes.push_back(s);
  if (sizes.back() != cap) sizes.push_back(cap);
  return sizes;
}

#ifdef KBN_WITH_CUDA

// NOTE: one stream for everything. The graphs are captured on the engine's stream and replayed on it, and the
// eager steps of a graph-mode engine run on it too (ModelRunner makes it the current stream of every call).
// So the input copies, a replay, the eager logits and sampling after it, and the next step are ordered with no
// event between them; and the memory the graphs use may be shared. When a capture ends, the intermediate
// tensors of the captured forward are freed back to the caching allocator (only each graph's output stays
// held); their blocks sit in this stream's free list, so smaller graphs captured later, and eager steps, reuse
// them, and every replay writes into them again. That is safe because all users of those blocks are
// serialised on this one stream, and nothing allocated after the capture is kept across a replay: an eager
// step frees its tensors before it ends, and a graph step copies host data straight into the static buffers
// and computes its logits after the replay. (Device state an op keeps across calls, such as cuBLASLt's
// workspace of this stream, is taken from the allocator once, during a warm-up, and never freed, so it is
// never in a free list.) The allocator hands cached blocks back to the driver in cuda_empty_cache() and when a
// cudaMalloc fails (an eager step out of memory, which a long run can reach through the cache's fragmentation:
// gpt-oss-20b's prefill-heavy eval did), but never the blocks handed out during a capture: those stay mapped
// until release() says the graphs are gone (cuda_graph_memory_released). Before that rule, the out-of-memory
// retry unmapped them and the next replay faulted (cudaErrorIllegalAddress).

CudaGraphRunner::CudaGraphRunner(CausalLM& model, std::vector<KVCache>& kv_caches, Device device, Stream stream,
                                 const std::vector<int64_t>& sizes, int64_t max_model_len, int64_t block_size)
    : device_(device), stream_(stream), max_model_len_(max_model_len), block_size_(block_size), sizes_(sizes) {
  KBN_CHECK(device.is_cuda(), "CUDA graphs need a CUDA device, got ", device.str());
  KBN_CHECK(stream != nullptr,
            "CUDA graphs: capture needs a created stream (the legacy default stream cannot capture)");
  KBN_CHECK(!kv_caches.empty(), "CUDA graphs: capture needs the allocated KV caches (the graphs hold their addresses)");
  KBN_CHECK(max_model_len >= 1 && block_size >= 1, "CUDA graphs: max_model_len and block_size must be >= 1, got ",
            max_model_len, " and ", block_size);
  KBN_CHECK(!sizes_.empty() && sizes_.front() >= 1 && std::is_sorted(sizes_.begin(), sizes_.end()) &&
                std::adjacent_find(sizes_.begin(), sizes_.end()) == sizes_.end(),
            "CUDA graphs: capture sizes must be distinct, ascending and >= 1");
  const auto start = std::chrono::steady_clock::now();
  const StreamGuard guard(stream_);
  const int64_t reserved_before = int64_t(cuda_allocator_stats(device.index).reserved_bytes);
  max_batch_ = sizes_.back();
  max_blocks_per_seq_ = (max_model_len + block_size - 1) / block_size;
  for (const KVCache& c : kv_caches) num_kv_groups_ = std::max<int64_t>(num_kv_groups_, c.kv_group + 1);
  const int64_t token_rows = 2 + num_kv_groups_;

  const size_t rows_bytes = size_t(token_rows * max_batch_) * sizeof(int64_t);
  const size_t seq_lens_bytes = size_t(max_batch_) * sizeof(int32_t);
  const size_t tables_bytes = size_t(num_kv_groups_ * max_batch_ * max_blocks_per_seq_) * sizeof(int32_t);
  for (const KVCache& c : kv_caches) stateful_ = stateful_ || !c.states.empty();
  const size_t state_bytes = stateful_ ? size_t(2 * max_batch_) * sizeof(int32_t) : 0;
  KBN_CUDA_CHECK(cudaHostAlloc(&host_, rows_bytes + seq_lens_bytes + tables_bytes + state_bytes, cudaHostAllocDefault));
  try {
    host_rows_ = static_cast<int64_t*>(host_);
    host_seq_lens_ = reinterpret_cast<int32_t*>(static_cast<char*>(host_) + rows_bytes);
    host_block_tables_ = reinterpret_cast<int32_t*>(static_cast<char*>(host_) + rows_bytes + seq_lens_bytes);
    host_state_rows_ =
        reinterpret_cast<int32_t*>(static_cast<char*>(host_) + rows_bytes + seq_lens_bytes + tables_bytes);
    KBN_CUDA_CHECK(cudaEventCreateWithFlags(&inputs_copied_, cudaEventDisableTiming));

    // Every row starts as padding: token 0 at position 0, not stored (slot -1), no keys (seq_len 0).
    std::memset(host_, 0, rows_bytes + seq_lens_bytes + tables_bytes);
    std::fill(host_rows_ + 2 * max_batch_, host_rows_ + token_rows * max_batch_, int64_t(-1));
    if (stateful_) {  // padding: no state slot (the state ops skip the row); a decode continues its state
      std::fill(host_state_rows_, host_state_rows_ + max_batch_, -1);
      std::fill(host_state_rows_ + max_batch_, host_state_rows_ + 2 * max_batch_, 1);
      state_rows_ = Tensor::empty({2, max_batch_}, DType::i32, device);
      KBN_CUDA_CHECK(
          cudaMemcpyAsync(state_rows_.data_ptr(), host_state_rows_, state_bytes, cudaMemcpyHostToDevice, stream_));
    }
    token_rows_ = Tensor::empty({token_rows, max_batch_}, DType::i64, device);
    seq_lens_ = Tensor::empty({max_batch_}, DType::i32, device);
    block_tables_ = Tensor::empty({num_kv_groups_, max_batch_, max_blocks_per_seq_}, DType::i32, device);
    query_start_loc_ = Tensor::zeros({1}, DType::i32, device);
    KBN_CUDA_CHECK(cudaMemcpyAsync(token_rows_.data_ptr(), host_rows_, rows_bytes, cudaMemcpyHostToDevice, stream_));
    KBN_CUDA_CHECK(
        cudaMemcpyAsync(seq_lens_.data_ptr(), host_seq_lens_, seq_lens_bytes, cudaMemcpyHostToDevice, stream_));
    KBN_CUDA_CHECK(
        cudaMemcpyAsync(block_tables_.data_ptr(), host_block_tables_, tables_bytes, cudaMemcpyHostToDevice, stream_));
    KBN_CUDA_CHECK(cudaEventRecord(inputs_copied_, stream_));

    // Largest first: the smaller graphs' activations then fit in blocks the larger ones already freed.
    for (auto it = sizes_.rbegin(); it != sizes_.rend(); ++it) capture(model, kv_caches, *it);
    std::reverse(graphs_.begin(), graphs_.end());
    KBN_CUDA_CHECK(cudaStreamSynchronize(stream_));
  } catch (...) {
    release();
    throw;
  }
  capture_bytes_ = int64_t(cuda_allocator_stats(device.index).reserved_bytes) - reserved_before;
  capture_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

CudaGraphRunner::~CudaGraphRunner() { release(); }

void CudaGraphRunner::release() {
  // No replay may still read the host buffer or run when its exec goes away.
  if (stream_) cudaStreamSynchronize(stream_);
  const bool had_graphs = !graphs_.empty();
  for (Graph& g : graphs_)
    if (g.exec) cudaGraphExecDestroy(g.exec);
  graphs_.clear();
  if (had_graphs) cuda_graph_memory_released(device_.index);
  if (inputs_copied_) cudaEventDestroy(inputs_copied_);
  inputs_copied_ = nullptr;
  if (host_) cudaFreeHost(host_);
  host_ = nullptr;
}

AttentionMetadata CudaGraphRunner::decode_metadata(int64_t size) const {
  AttentionMetadata md;
  md.num_decodes = size;
  md.slot_mapping = token_rows_.select(0, 2).slice(0, 0, size);
  md.query_start_loc = query_start_loc_;
  md.seq_lens = seq_lens_.slice(0, 0, size);
  md.block_tables = block_tables_.select(0, 0).slice(0, 0, size);
  for (int64_t g = 1; g < num_kv_groups_; ++g) {
    md.more_slot_mappings.push_back(token_rows_.select(0, 2 + g).slice(0, 0, size));
    md.more_block_tables.push_back(block_tables_.select(0, g).slice(0, 0, size));
  }
  if (stateful_) {
    md.state_indices = state_rows_.select(0, 0).slice(0, 0, size);
    md.has_initial_state = state_rows_.select(0, 1).slice(0, 0, size);
  }
  // The decode attention picks its key partitioning on the host from this bound, once, at capture: it must
  // cover every sequence a replay can serve (can_run keeps them within max_model_len); per sequence, the
  // kernels stop at its own seq_len.
  md.max_decode_seq_len = max_model_len_;
  return md;
}

void CudaGraphRunner::capture(CausalLM& model, std::vector<KVCache>& kv_caches, int64_t size) {
  const AttentionMetadata md = decode_metadata(size);
  const Tensor input_ids = token_rows_.select(0, 0).slice(0, 0, size);
  const Tensor positions = token_rows_.select(0, 1).slice(0, 0, size);
  const ForwardContextGuard context({&md, &kv_caches});
  // Warm-up first, eagerly, on the same inputs: each op's one-time work (cuBLASLt plans for this batch size and
  // the workspace of this stream, kernel attributes) happens outside the capture, and the caching allocator
  // then holds blocks for every tensor the captured forward asks for, in the same order.
  model.forward(input_ids, positions);
  KBN_CUDA_CHECK(cudaStreamSynchronize(stream_));  // a fault of the warm-up surfaces here, named as such

  // Thread-local mode: an unsafe call from this thread (a synchronisation, a host read of device memory)
  // fails the capture; other threads are not affected.
  KBN_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
  Graph g;
  g.size = size;
  cudaGraph_t graph = nullptr;
  try {
    g.output = model.forward(input_ids, positions);
  } catch (const Error& e) {
    cudaStreamEndCapture(stream_, &graph);
    if (graph) cudaGraphDestroy(graph);
    (void)cudaGetLastError();  // the capture's error is reported below, not left for the next call
    KBN_FAIL("CUDA graph capture of a decode batch of ", size, " sequences failed: ", e.what(),
             " (a decode forward must not synchronise or read device memory on the host)");
  }
  const cudaError_t ended = cudaStreamEndCapture(stream_, &graph);
  if (ended != cudaSuccess) {
    if (graph) cudaGraphDestroy(graph);
    (void)cudaGetLastError();
    KBN_FAIL("CUDA graph capture of a decode batch of ", size, " sequences failed: ", cudaGetErrorName(ended), " (",
             cudaGetErrorString(ended), "); an operation of the decode forward is not capturable");
  }
  const cudaError_t instantiated = cudaGraphInstantiate(&g.exec, graph, 0);
  cudaGraphDestroy(graph);  // the executable graph is independent of the captured one
  KBN_CUDA_CHECK(instantiated);
  graphs_.push_back(std::move(g));
  KBN_CUDA_CHECK(cudaGraphUpload(graphs_.back().exec, stream_));  // the first replay then pays no upload
}

bool CudaGraphRunner::can_run(const SchedulerOutput& out) const {
  if (graphs_.empty() || out.num_prefills != 0 || out.seqs.empty() || int64_t(out.seqs.size()) > max_batch_)
    return false;
  for (const ScheduledSequence& e : out.seqs) {
    if (e.num_new_tokens != 1 || e.num_computed_tokens + 1 > max_model_len_ ||
        int64_t(e.seq->block_table.size()) > max_blocks_per_seq_)
      return false;
  }
  return true;
}

Tensor CudaGraphRunner::run(const SchedulerOutput& out, const std::vector<std::pair<int32_t, int32_t>>& pending,
                            const Tensor& pending_ids) {
  KBN_CHECK(can_run(out), "CudaGraphRunner::run: not a decode-only step of at most ", max_batch_,
            " sequences within max_model_len ", max_model_len_);
  KBN_CHECK(current_stream() == stream_, "CudaGraphRunner::run: the current stream is not the one the graphs were ",
            "captured on, so the step's eager work would not be ordered with the replay");
  const int64_t n = int64_t(out.seqs.size());
  const Graph& g = *std::find_if(graphs_.begin(), graphs_.end(), [n](const Graph& x) { return x.size >= n; });

  // The last replay's copies read the pinned buffers asynchronously; they finished long ago (that step
  // synchronised to sample), so this returns at once, but it is what makes rewriting the buffers safe.
  KBN_CUDA_CHECK(cudaEventSynchronize(inputs_copied_));
  std::vector<StepSequence> seqs;
  seqs.reserve(size_t(n));
  for (const ScheduledSequence& e : out.seqs)
    seqs.push_back({e.num_computed_tokens, 1, &e.seq->block_table, false, -1, &e.seq->more_block_tables});
  const StepLayout layout = build_step_layout(seqs, block_size_);
  const int64_t width = layout.max_blocks;  // block-table columns the real rows need
  KBN_CHECK(width <= max_blocks_per_seq_, "CUDA graphs: a sequence has ", width, " blocks, more than the ",
            max_blocks_per_seq_, " the graphs were captured for");
  int64_t* ids = host_rows_;
  int64_t* positions = host_rows_ + max_batch_;
  KBN_CHECK(layout.num_kv_groups() == num_kv_groups_, "CUDA graphs: the step has ", layout.num_kv_groups(),
            " KV cache groups, the graphs were captured for ", num_kv_groups_);
  const auto slots = [&](int64_t g) { return host_rows_ + (2 + g) * max_batch_; };
  const auto tables = [&](int64_t g) { return host_block_tables_ + g * max_batch_ * max_blocks_per_seq_; };
  for (int64_t i = 0; i < n; ++i) {
    // The token decoded now; a pending one is copied on the device below.
    const Sequence& seq = *out.seqs[size_t(i)].seq;
    const int64_t t = out.seqs[size_t(i)].num_computed_tokens;
    ids[i] = t < seq.num_known_tokens() ? seq.token(t) : 0;
    positions[i] = layout.positions[size_t(i)];
    for (int64_t g = 0; g < num_kv_groups_; ++g) {
      slots(g)[i] = (g == 0 ? layout.slot_mapping : layout.more_slot_mappings[size_t(g - 1)])[size_t(i)];
      const std::vector<int32_t>& t = g == 0 ? layout.block_tables : layout.more_block_tables[size_t(g - 1)];
      std::copy_n(t.begin() + i * width, width, tables(g) + i * max_blocks_per_seq_);
    }
    host_seq_lens_[i] = layout.seq_lens[size_t(i)];
    if (stateful_) {
      const int32_t slot = out.seqs[size_t(i)].seq->state_slot;
      KBN_CHECK(slot >= 0, "CUDA graphs: decoding sequence ", out.seqs[size_t(i)].seq->id,
                " of a recurrent-state model holds no state slot");
      host_state_rows_[i] = slot;
    }
  }
  // Padding rows up to the graph's size: seq_len 0 makes both decode kernels read no key and write zeros
  // (split-KV: every split returns at once and the merge gives 0 for a sequence without keys), and slot -1
  // makes the KV store skip the row, so padding never touches the cache; token 0 and position 0 are valid
  // inputs for the embedding and the rotary tables. Their block-table rows are never read.
  for (int64_t i = n; i < g.size; ++i) {
    ids[i] = 0;
    positions[i] = 0;
    for (int64_t g = 0; g < num_kv_groups_; ++g) slots(g)[i] = -1;
    host_seq_lens_[i] = 0;
    if (stateful_) host_state_rows_[i] = -1;
  }

  const size_t row_pitch = size_t(max_batch_) * sizeof(int64_t);
  const size_t table_pitch = size_t(max_blocks_per_seq_) * sizeof(int32_t);
  KBN_CUDA_CHECK(cudaMemcpy2DAsync(token_rows_.data_ptr(), row_pitch, host_rows_, row_pitch,
                                   size_t(g.size) * sizeof(int64_t), size_t(2 + num_kv_groups_), cudaMemcpyHostToDevice,
                                   stream_));
  KBN_CUDA_CHECK(cudaMemcpyAsync(seq_lens_.data_ptr(), host_seq_lens_, size_t(g.size) * sizeof(int32_t),
                                 cudaMemcpyHostToDevice, stream_));
  // The real rows of each group's table: one copy per group (the padding rows are never read).
  for (int64_t t = 0; t < num_kv_groups_; ++t) {
    const int64_t offset = t * max_batch_ * max_blocks_per_seq_;
    KBN_CUDA_CHECK(cudaMemcpy2DAsync(block_tables_.data<int32_t>() + offset, table_pitch, host_block_tables_ + offset,
                                     table_pitch, size_t(width) * sizeof(int32_t), size_t(n), cudaMemcpyHostToDevice,
                                     stream_));
  }
  if (stateful_)  // only the slot row changes between steps (has_initial_state stays 1)
    KBN_CUDA_CHECK(cudaMemcpyAsync(state_rows_.data_ptr(), host_state_rows_, size_t(g.size) * sizeof(int32_t),
                                   cudaMemcpyHostToDevice, stream_));
  KBN_CUDA_CHECK(cudaEventRecord(inputs_copied_, stream_));
  if (!pending.empty()) {
    KBN_CHECK(pending_ids.defined() && pending_ids.is_cuda() && pending_ids.dtype() == DType::i64,
              "CUDA graphs: pending tokens need their sampled ids as an i64 CUDA tensor");
    for (const auto& [row, src] : pending)
      KBN_CHECK(row >= 0 && row < n && src >= 0 && src < pending_ids.numel(), "CUDA graphs: pending token of row ",
                row, " from id ", src, " outside the step's ", n, " rows or the ", pending_ids.numel(), " ids");
    cuda::copy_indexed_i64(token_rows_.data<int64_t>(), pending_ids.data<int64_t>(), pending);  // row 0: input ids
  }
  KBN_CUDA_CHECK(cudaGraphLaunch(g.exec, stream_));
  return g.output.slice(0, 0, n);
}

#else

CudaGraphRunner::CudaGraphRunner(CausalLM&, std::vector<KVCache>&, Device device, Stream stream,
                                 const std::vector<int64_t>& sizes, int64_t max_model_len, int64_t block_size)
    : device_(device), stream_(stream), max_model_len_(max_model_len), block_size_(block_size), sizes_(sizes) {
  KBN_FAIL("CUDA graphs need a CUDA device; this kb-nano was built without CUDA (device ", device.str(), ")");
}

CudaGraphRunner::~CudaGraphRunner() = default;

void CudaGraphRunner::release() {}

bool CudaGraphRunner::can_run(const SchedulerOutput&) const { return false; }

Tensor CudaGraphRunner::run(const SchedulerOutput&, const std::vector<std::pair<int32_t, int32_t>>&, const Tensor&) {
  KBN_FAIL("CUDA graphs need a CUDA device; this kb-nano was built without CUDA");
}

#endif

}  // namespace kbn::engine
