#pragma once
// Tensor parallelism in one process: one persistent thread per rank (started with the group, joined by its
// destructor), each with its own model shard, device and communicator (kbn/comm.h). run(fn) executes fn(rank)
// on every rank's thread at once, with that rank's parallel_state() and (on GPUs) current device set, and
// returns when all have finished; the collectives inside the model keep the ranks in step. A serving step
// costs two condition-variable hand-offs per rank, no thread creation. Everything a rank builds (its model, KV caches, streams) must be
// built inside run(), on its own thread, because parallel linears size their shards from parallel_state().
//
// Ranks on CPU (device cpu) exchange through shared memory: the whole TP path, sharding and collectives,
// runs and is tested without a GPU. Ranks on GPUs use NCCL, rank r on cuda:r.
#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "kbn/comm.h"
#include "kbn/device.h"

namespace kbn::engine {

class TensorParallelGroup {
 public:
  // `size` ranks; `device` cpu puts every rank on the CPU, cuda:0 puts rank r on cuda:r.
  TensorParallelGroup(int size, Device device);
  ~TensorParallelGroup();
  TensorParallelGroup(const TensorParallelGroup&) = delete;
  TensorParallelGroup& operator=(const TensorParallelGroup&) = delete;

  int size() const { return int(comms_.size()); }
  Device device_of(int rank) const;  // cpu, or cuda:rank
  // What carries the collectives (Communicator::describe()).
  std::string collectives() const { return comms_.front()->describe(); }

  // Runs fn(rank) on every rank's thread and waits for all (not reentrant: one run at a time). When a rank
  // throws, the group is aborted (ranks blocked in a CPU collective throw too) and the error of the rank that
  // failed first is rethrown here; an aborted group stays aborted (its collectives throw), so build a new one.
  void run(const std::function<void(int rank)>& fn);

 private:
  void worker(int rank);

  Device device_;
  std::vector<std::unique_ptr<Communicator>> comms_;
  // The job every worker runs once per generation, and the results of the current run.
  std::mutex mu_;
  std::condition_variable job_ready_, job_done_;
  const std::function<void(int)>* job_ = nullptr;
  int64_t generation_ = 0;
  int finished_ = 0;
  int first_failure_ = -1;  // the rank whose error the current run reports
  bool stopping_ = false;
  std::vector<std::exception_ptr> errors_;
  std::vector<std::thread> threads_;
};

}  // namespace kbn::engine
