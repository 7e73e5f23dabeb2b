#pragma once
// A one-shot all-reduce over peer GPU memory for the ranks of one process (one GPU each), the small-message path
// of the CUDA communicator (kbn/comm.h). At decode, a tensor-parallel layer's all-reduce moves a few KiB to a few
// hundred KiB, where NCCL's ring costs ~10 µs of protocol for well under a microsecond of NVLink transfer. Here
// every rank copies its tensor into a staging buffer the others can read, raises a flag in every peer's signal
// area, waits for the peers' flags, and sums all the staging buffers itself: one kernel, one round trip.
//
// Protocol (per block b of a fixed grid, the same on every rank for every call):
//  - epoch e = ++counter[b] = the call count (in device memory, so CUDA graph replays advance it too); staging
//    half e % 2;
//  - block b writes its slice of x into its own staging half, then (release, system scope) sets
//    flag[b][my rank] = e in every peer's signal area;
//  - it waits (acquire) until flag[b][p] >= e for every peer p, then sums the slice over ranks 0..n-1 in rank order
//    (so every rank gets bit-identical values) and writes x.
// Two halves make a closing barrier unnecessary: a rank writes half e % 2 again only at epoch e + 2, which needs
// every peer's flag e + 1, which a peer raises only after it finished reading epoch e. A rank that never arrives
// (another rank failed) makes the kernel trap after 10 s instead of spinning forever.
#include <cstddef>
#include <memory>
#include <vector>

#include "kbn/tensor.h"

namespace kbn {

class PeerAllReduceGroup;

// Rank `rank`'s handle on a group's buffers.
class PeerAllReduce {
 public:
  PeerAllReduce(std::shared_ptr<PeerAllReduceGroup> group, int rank);
  ~PeerAllReduce();
  // Whether this path takes x: a contiguous f32/f16/bf16 CUDA tensor on this rank's device, at most
  // max_bytes(), a whole number of 16-byte vectors, 16-byte aligned.
  bool accepts(const Tensor& x) const;
  // x <- sum of x over the ranks, enqueued on `stream`. Every rank must call it for the same call in the same
  // order (as every collective); needs accepts(x).
  void all_reduce_sum(const Tensor& x, Stream stream);
  size_t max_bytes() const;

 private:
  std::shared_ptr<PeerAllReduceGroup> group_;
  int rank_;
};

// Handles for ranks 0..devices.size()-1 (rank i on devices[i]) sharing staging buffers of max_bytes per rank, or an
// empty vector when some pair of the devices cannot access each other's memory (peer access is enabled here for
// every pair that can). Needs a CUDA build.
std::vector<std::unique_ptr<PeerAllReduce>> make_peer_all_reduce(const std::vector<int>& devices, size_t max_bytes);

}  // namespace kbn
