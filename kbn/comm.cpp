#include "kbn/comm.h"

#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "kbn/checks.h"
#include "kbn/error.h"

#ifdef KBN_WITH_CUDA
#include <dlfcn.h>

#include "kbn/device.h"
#include "kbn/dynlib.h"
#include "kbn/peer_all_reduce.h"
#if __has_include(<nccl.h>)
#include <nccl.h>
#define KBN_HAVE_NCCL_HEADER 1
#endif
#endif

namespace kbn {

namespace {

void check_collective_input(const Tensor& x, const char* what) {
  check_defined(x, what, "x");
  check_contiguous(x, what, "x");
  check_dtype(x, what, "x", {DType::f32, DType::f16, DType::bf16});
}

// ---- CPU group: shared memory between the rank threads ----

struct CpuShared {
  explicit CpuShared(int n) : size(n), slots(size_t(n), nullptr) {}
  std::mutex mu;
  std::condition_variable cv;
  const int size;
  int arrived = 0;
  int64_t generation = 0;
  std::vector<const Tensor*> slots;
  bool aborted = false;
  std::string why;

  // Every rank waits until all have arrived; throws for every rank once the group is aborted.
  void barrier(std::unique_lock<std::mutex>& lock, int rank) {
    if (aborted) KBN_FAIL("tensor-parallel rank ", rank, ": the group was aborted: ", why);
    const int64_t gen = generation;
    if (++arrived == size) {
      arrived = 0;
      ++generation;
      cv.notify_all();
    } else {
      cv.wait(lock, [&] { return generation != gen || aborted; });
    }
    if (aborted) KBN_FAIL("tensor-parallel rank ", rank, ": the group was aborted: ", why);
  }
};

class CpuCommunicator final : public Communicator {
 public:
  CpuCommunicator(std::shared_ptr<CpuShared> shared, int rank) : shared_(std::move(shared)), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return shared_->size; }

  void all_reduce_sum(const Tensor& x) override {
    check_collective_input(x, "all_reduce (cpu group)");
    KBN_CHECK(x.is_cpu(), "all_reduce (cpu group): 'x' must be a CPU tensor, got ", x.str());
    std::unique_lock<std::mutex> lock(shared_->mu);
    shared_->slots[size_t(rank_)] = &x;
    shared_->barrier(lock, rank_);
    check_peers(lock, x, "all_reduce");
    // Rank order, in float, on every rank: all ranks compute the same bits.
    std::vector<float> sum = shared_->slots[0]->to_floats();
    for (int r = 1; r < shared_->size; ++r) {
      const std::vector<float> v = shared_->slots[size_t(r)]->to_floats();
      for (size_t i = 0; i < sum.size(); ++i) sum[i] += v[i];
    }
    shared_->barrier(lock, rank_);  // every rank has read every input before any is overwritten
    lock.unlock();
    Tensor dst = x;  // a handle on the same storage: the sum lands in the caller's tensor
    dst.copy_(Tensor::from_floats(sum, x.shape(), x.dtype()));
  }

  Tensor all_gather(const Tensor& x) override {
    check_collective_input(x, "all_gather (cpu group)");
    KBN_CHECK(x.is_cpu(), "all_gather (cpu group): 'x' must be a CPU tensor, got ", x.str());
    Shape shape{int64_t(shared_->size)};
    for (int64_t d : x.shape()) shape.push_back(d);
    Tensor out = Tensor::empty(shape, x.dtype());
    std::unique_lock<std::mutex> lock(shared_->mu);
    shared_->slots[size_t(rank_)] = &x;
    shared_->barrier(lock, rank_);
    check_peers(lock, x, "all_gather");
    for (int r = 0; r < shared_->size; ++r)
      std::memcpy(static_cast<char*>(out.data_ptr()) + size_t(r) * x.nbytes(), shared_->slots[size_t(r)]->data_ptr(),
                  x.nbytes());
    shared_->barrier(lock, rank_);
    return out;
  }

  void abort(const std::string& why) override {
    std::lock_guard<std::mutex> lock(shared_->mu);
    if (!shared_->aborted) shared_->why = why;
    shared_->aborted = true;
    shared_->cv.notify_all();
  }
  std::string describe() const override { return "shared memory (sums in rank order)"; }

 private:
  // Called between the two barriers of a collective. Every rank sees the same mismatch, so every rank
  // throws; each first waits at the second barrier, so that no rank's tensor is freed (by its unwinding)
  // while another is still reading it.
  void check_peers(std::unique_lock<std::mutex>& lock, const Tensor& x, const char* what) const {
    for (int r = 0; r < shared_->size; ++r) {
      const Tensor& p = *shared_->slots[size_t(r)];
      if (p.shape() == x.shape() && p.dtype() == x.dtype()) continue;
      const std::string msg = std::string(what) + ": rank " + std::to_string(rank_) + " has " + x.str() +
                              " but rank " + std::to_string(r) + " has " + p.str() +
                              " (every rank must pass the same shape and dtype)";
      shared_->barrier(lock, rank_);
      KBN_FAIL(msg);
    }
  }

  std::shared_ptr<CpuShared> shared_;
  int rank_;
};

}  // namespace

std::vector<std::unique_ptr<Communicator>> make_cpu_group(int size) {
  KBN_CHECK(size >= 1, "make_cpu_group: group size must be >= 1, got ", size);
  auto shared = std::make_shared<CpuShared>(size);
  std::vector<std::unique_ptr<Communicator>> out;
  for (int r = 0; r < size; ++r) out.push_back(std::make_unique<CpuCommunicator>(shared, r));
  return out;
}

#if defined(KBN_WITH_CUDA) && defined(KBN_HAVE_NCCL_HEADER)

namespace {

// ---- NCCL, loaded at run time ----

struct NcclApi {
  decltype(&ncclCommInitAll) comm_init_all = nullptr;
  decltype(&ncclCommDestroy) comm_destroy = nullptr;
  decltype(&ncclAllReduce) all_reduce = nullptr;
  decltype(&ncclAllGather) all_gather = nullptr;
  decltype(&ncclGetErrorString) error_string = nullptr;
};

const NcclApi& nccl() {
  static const NcclApi api = [] {
    void* h = open_library("tensor parallelism needs NCCL (libnccl.so.2)", "KBN_NCCL_LIBRARY",
                           {"libnccl.so.2", "/usr/local/cuda/lib64/libnccl.so.2",
                            "/usr/lib/x86_64-linux-gnu/libnccl.so.2"},
                           // pip's nvidia-nccl-cu1x wheels (PyTorch's NCCL).
                           {"/usr/local/lib/python3*/dist-packages/nvidia/nccl/lib/libnccl.so.2",
                            "/usr/local/lib/python3*/site-packages/nvidia/nccl/lib/libnccl.so.2",
                            "/usr/lib/python3*/dist-packages/nvidia/nccl/lib/libnccl.so.2",
                            "/usr/lib/python3*/site-packages/nvidia/nccl/lib/libnccl.so.2",
                            "/opt/*/lib/python3*/site-packages/nvidia/nccl/lib/libnccl.so.2",
                            "/root/.local/lib/python3*/site-packages/nvidia/nccl/lib/libnccl.so.2"},
                           RTLD_NOW | RTLD_GLOBAL);
    NcclApi a;
    auto sym = [&](const char* name) { return library_symbol(h, "NCCL", name); };
    a.comm_init_all = reinterpret_cast<decltype(a.comm_init_all)>(sym("ncclCommInitAll"));
    a.comm_destroy = reinterpret_cast<decltype(a.comm_destroy)>(sym("ncclCommDestroy"));
    a.all_reduce = reinterpret_cast<decltype(a.all_reduce)>(sym("ncclAllReduce"));
    a.all_gather = reinterpret_cast<decltype(a.all_gather)>(sym("ncclAllGather"));
    a.error_string = reinterpret_cast<decltype(a.error_string)>(sym("ncclGetErrorString"));
    return a;
  }();
  return api;
}

ncclDataType_t nccl_type(DType dt) {
  switch (dt) {
    case DType::f32:
      return ncclFloat32;
    case DType::f16:
      return ncclFloat16;
    case DType::bf16:
      return ncclBfloat16;
    default:
      KBN_FAIL("NCCL collective: dtype ", dtype_name(dt), " is not supported (f32, f16, bf16)");
  }
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(ncclComm_t comm, int rank, int size, int device, std::unique_ptr<PeerAllReduce> peer)
      : comm_(comm), rank_(rank), size_(size), device_(device), peer_(std::move(peer)) {}
  ~NcclCommunicator() override {
    if (comm_) nccl().comm_destroy(comm_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void all_reduce_sum(const Tensor& x) override {
    check_collective_input(x, "all_reduce (nccl)");
    check_device(x, "all_reduce");
    if (peer_ && peer_->accepts(x)) {
      peer_->all_reduce_sum(x, current_stream());
      return;
    }
    check(nccl().all_reduce(x.data_ptr(), x.data_ptr(), size_t(x.numel()), nccl_type(x.dtype()), ncclSum, comm_,
                            current_stream()),
          "ncclAllReduce", x);
  }

  Tensor all_gather(const Tensor& x) override {
    check_collective_input(x, "all_gather (nccl)");
    check_device(x, "all_gather");
    Shape shape{int64_t(size_)};
    for (int64_t d : x.shape()) shape.push_back(d);
    Tensor out = Tensor::empty(shape, x.dtype(), x.device());
    check(nccl().all_gather(x.data_ptr(), out.data_ptr(), size_t(x.numel()), nccl_type(x.dtype()), comm_,
                            current_stream()),
          "ncclAllGather", x);
    return out;
  }

  void abort(const std::string&) override {}  // enqueued NCCL work cannot be interrupted from here

  std::string describe() const override {
    if (!peer_) return "NCCL";
    return "NCCL; all-reduces up to " + std::to_string(peer_->max_bytes() >> 10) +
           " KiB by a one-shot kernel over peer memory";
  }

 private:
  void check_device(const Tensor& x, const char* what) const {
    KBN_CHECK(x.is_cuda() && x.device().index == device_, what, " (nccl): rank ", rank_, " runs on cuda:", device_,
              ", got 'x' ", x.str());
  }
  void check(ncclResult_t r, const char* call, const Tensor& x) const {
    KBN_CHECK(r == ncclSuccess, call, " failed with ", nccl().error_string(r), " on ", x.str(), " (rank ", rank_,
              " of ", size_, ")");
  }

  ncclComm_t comm_;
  int rank_, size_, device_;
  std::unique_ptr<PeerAllReduce> peer_;  // null: NCCL for every size
};

}  // namespace

std::vector<std::unique_ptr<Communicator>> make_nccl_group(const std::vector<int>& devices,
                                                           size_t peer_all_reduce_bytes) {
  KBN_CHECK(!devices.empty(), "make_nccl_group: no devices");
  for (int d : devices)
    KBN_CHECK(d >= 0 && d < cuda_device_count(), "make_nccl_group: cuda:", d, " is not available (",
              cuda_device_count(), " CUDA devices visible)");
  // NVLink multicast (NVLS) stays off unless the caller chose otherwise: on shared hosts a program using it
  // can take the host's GPUs out of service.
  setenv("NCCL_NVLS_ENABLE", "0", 0);
  std::vector<ncclComm_t> comms(devices.size(), nullptr);
  const ncclResult_t r = nccl().comm_init_all(comms.data(), int(devices.size()), devices.data());
  KBN_CHECK(r == ncclSuccess, "ncclCommInitAll over ", devices.size(), " GPUs failed: ", nccl().error_string(r));
  const char* env = std::getenv("KBN_PEER_ALL_REDUCE");
  std::vector<std::unique_ptr<PeerAllReduce>> peers;
  if (peer_all_reduce_bytes > 0 && !(env && std::string(env) == "0"))
    peers = make_peer_all_reduce(devices, peer_all_reduce_bytes);
  std::vector<std::unique_ptr<Communicator>> out;
  for (size_t i = 0; i < devices.size(); ++i)
    out.push_back(std::make_unique<NcclCommunicator>(comms[i], int(i), int(devices.size()), devices[i],
                                                     peers.empty() ? nullptr : std::move(peers[i])));
  return out;
}

#else

std::vector<std::unique_ptr<Communicator>> make_nccl_group(const std::vector<int>& devices, size_t) {
  KBN_FAIL("tensor parallelism over ", devices.size(), " GPUs needs a CUDA build with NCCL's header (nccl.h); ",
           "this binary has neither");
}

#endif

}  // namespace kbn
