#pragma once
// Reading and writing the safetensors format (https://github.com/huggingface/safetensors):
//   [u64 little-endian N][N bytes of JSON header][data section]
// The header maps each tensor name to {"dtype", "shape", "data_offsets": [begin, end]} (byte offsets into the
// data section) and may hold "__metadata__": {string: string}.
//
// Reading memory-maps the file read-only and validates the whole header when the file is opened, so a
// corrupt or truncated file fails there with an error naming the file and the problem, never later.
// Overlapping tensors are refused; unused bytes between or after tensors are accepted (the reference reader
// refuses them, but they cannot make a load read the wrong bytes).
// load() returns a CPU copy: the format only promises 8-byte alignment of the data section, not of each
// tensor, and a copy lets the file be closed while its tensors live on. read_into() copies straight from
// the mapping into an existing tensor on any device (no intermediate host copy) for large checkpoints.
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kbn/dtype.h"
#include "kbn/tensor.h"

namespace kbn {

struct TensorInfo {
  std::string name;
  DType dtype = DType::f32;
  Shape shape;
  uint64_t begin = 0, end = 0;  // byte range in the data section
};

// The safetensors spelling of a kbn dtype ("BF16", "F8_E4M3", ...).
const char* safetensors_dtype_name(DType dt);

class SafetensorsFile {
 public:
  // Validates the header against the file size: every error names `path` and what is wrong.
  static SafetensorsFile open(const std::string& path);

  const std::vector<TensorInfo>& tensors() const;         // in file order (ascending data offset)
  const TensorInfo* find(const std::string& name) const;  // nullptr when absent
  // A contiguous CPU tensor holding a copy of the bytes; the error names the tensor and the file when absent.
  Tensor load(const std::string& name) const;
  // Copies the named tensor's bytes into `dst`, which must be contiguous, on any device, with the same dtype
  // and shape.
  void read_into(const std::string& name, const Tensor& dst) const;
  // The tensor's bytes inside the mapping; valid while this object or a copy of it lives.
  const uint8_t* data(const TensorInfo& info) const;
  const std::map<std::string, std::string>& metadata() const;  // "__metadata__"
  const std::string& path() const;

 private:
  struct State;
  std::shared_ptr<const State> state_;  // copies share one mapping; the last one unmaps
};

// A checkpoint: a single .safetensors file, a directory with model.safetensors, or a directory (or the index
// file itself) with model.safetensors.index.json whose "weight_map" maps each tensor name to its shard file.
// Every shard is opened and every weight_map entry checked against its shard up front.
class Checkpoint {
 public:
  static Checkpoint open(const std::string& path);

  const std::string& path() const { return path_; }
  std::vector<std::string> names() const;                 // sorted
  const TensorInfo* find(const std::string& name) const;  // nullptr when absent
  // The error names the tensor and the checkpoint when absent.
  Tensor load(const std::string& name) const;
  void read_into(const std::string& name, const Tensor& dst) const;
  // Calls fn for every tensor in name order, loading one at a time so only one copy is alive at once.
  void for_each(const std::function<void(const std::string&, const Tensor&)>& fn) const;

 private:
  const SafetensorsFile& shard_of(const std::string& name) const;

  std::string path_;
  std::vector<SafetensorsFile> shards_;
  std::map<std::string, size_t> shard_index_;  // tensor name -> index into shards_
};

// Writes tensors (any device, any strides) and string metadata. Names must be unique, non-empty and not
// "__metadata__". Tensors are laid out by decreasing element size, so each one is aligned to its element
// size (the header is padded to a multiple of 8), as the reference implementation does. The file is written
// beside `path` and renamed into place, so a failed write never leaves a truncated file under that name.
void save_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

}  // namespace kbn
