#pragma once
// Collectives among the ranks of one tensor-parallel group living in this process, one thread per rank (the
// way kb-nano runs TP: engine::TensorParallelGroup starts the threads and installs each rank's communicator
// in its kbn::parallel_state()). Every rank calls each collective, in the same order, with tensors of the
// same shape and dtype, from its own thread.
//
// Two backends:
//  - CPU tensors: the ranks exchange through shared memory. Sums are taken in rank order, so every rank ends
//    with bit-identical values and runs are deterministic. This is what lets CI test the TP sharding of every
//    layer without a GPU.
//  - CUDA tensors: NCCL, one communicator per GPU created together (ncclCommInitAll), collectives enqueued on
//    the calling thread's current stream (so CUDA graphs capture them). All-reduces of up to
//    kPeerAllReduceBytes (decode-sized) take a one-shot kernel over peer memory instead (kbn/peer_all_reduce.h)
//    when every pair of GPUs has peer access; KBN_PEER_ALL_REDUCE=0 in the environment keeps them on NCCL. libnccl is loaded at run time
//    (dlopen), so a binary that never runs TP > 1 does not need it: $KBN_NCCL_LIBRARY, else libnccl.so.2 on
//    the loader's path, the CUDA toolkit's lib64, or pip's nvidia-nccl package; the error lists every place
//    tried.
#include <memory>
#include <string>
#include <vector>

#include "kbn/tensor.h"

namespace kbn {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // x <- sum of x over the ranks, in place (x contiguous, f32/f16/bf16).
  virtual void all_reduce_sum(const Tensor& x) = 0;
  // Returns [size, x.shape...] with rank r's x at index r, on x's device (x contiguous).
  virtual Tensor all_gather(const Tensor& x) = 0;
  // Marks the group failed (a rank's thread threw): ranks waiting in or entering a CPU collective throw
  // instead of waiting forever. NCCL collectives already enqueued cannot be interrupted.
  virtual void abort(const std::string& why) = 0;
  // What carries the collectives, for logs and result files.
  virtual std::string describe() const = 0;
};

// All-reduces up to this size go through the peer-memory kernel on CUDA groups (512 KiB: 64 tokens of a
// 4096-wide bf16 hidden state).
constexpr size_t kPeerAllReduceBytes = size_t(512) << 10;

// `size` communicators over CPU tensors, rank i at index i.
std::vector<std::unique_ptr<Communicator>> make_cpu_group(int size);

// One NCCL communicator per device in `devices` (rank i on devices[i]), with the peer-memory all-reduce for
// messages up to peer_all_reduce_bytes (0: NCCL for everything; also when $KBN_PEER_ALL_REDUCE is 0 or peer
// access is missing). Needs a CUDA build.
std::vector<std::unique_ptr<Communicator>> make_nccl_group(const std::vector<int>& devices,
                                                           size_t peer_all_reduce_bytes = kPeerAllReduceBytes);

}  // namespace kbn
