#include "kbn/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>
#include <unordered_map>

#include "kbn/error.h"

namespace kbn {

namespace {

namespace fs = std::filesystem;
using ordered_json = nlohmann::ordered_json;

// The reference implementation refuses larger headers; a bigger length field means a corrupt file.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

struct SafetensorsDType {
  const char* name;
  DType dtype;
};

constexpr SafetensorsDType kSupportedDTypes[] = {
    {"BF16", DType::bf16}, {"F16", DType::f16}, {"F32", DType::f32}, {"F8_E4M3", DType::fp8e4m3},
    {"I64", DType::i64},   {"I32", DType::i32}, {"U8", DType::u8},   {"BOOL", DType::boolean},
};

std::optional<DType> dtype_from_safetensors(const std::string& name) {
  for (const auto& d : kSupportedDTypes)
    if (name == d.name) return d.dtype;
  return std::nullopt;
}

std::string supported_dtype_list() {
  std::string out;
  for (const auto& d : kSupportedDTypes) out += std::string(out.empty() ? "" : ", ") + d.name;
  return out;
}

uint64_t read_le_u64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

void write_le_u64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = uint8_t(v >> (8 * i));
}

// A JSON integer in [0, limit]; floats such as 2.0 are refused, as the reference reader does.
std::optional<uint64_t> as_non_negative_int(const ordered_json& v, uint64_t limit) {
  if (v.is_number_unsigned()) {
    uint64_t u = v.get<uint64_t>();
    return u <= limit ? std::optional<uint64_t>(u) : std::nullopt;
  }
  if (v.is_number_integer() && v.get<int64_t>() >= 0 && uint64_t(v.get<int64_t>()) <= limit)
    return uint64_t(v.get<int64_t>());
  return std::nullopt;  // negative, too large, or not an integer (2.0 parses as a float)
}

std::string errno_text() { return std::strerror(errno); }

// Closes a file descriptor on every exit path of open().
struct FdCloser {
  int fd;
  ~FdCloser() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

const char* safetensors_dtype_name(DType dt) {
  for (const auto& d : kSupportedDTypes)
    if (d.dtype == dt) return d.name;
  KBN_FAIL("safetensors: no safetensors spelling for dtype ", dtype_name(dt));
}

struct SafetensorsFile::State {
  std::string path;
  const uint8_t* base = nullptr;  // the whole file, mapped read-only
  size_t file_size = 0;
  uint64_t data_start = 0;  // 8 + header length
  uint64_t data_size = 0;
  std::vector<TensorInfo> tensors;
  std::unordered_map<std::string, size_t> by_name;
  std::map<std::string, std::string> metadata;

  // Validates the header of the mapped file; fills tensors (sorted by offset), by_name and metadata.
  void parse_header();

  State() = default;
  State(const State&) = delete;
  State& operator=(const State&) = delete;
  ~State() {
    if (base) ::munmap(const_cast<uint8_t*>(base), file_size);
  }
};

void SafetensorsFile::State::parse_header() {
  auto where = [&] { return "safetensors file '" + path + "'"; };

  KBN_CHECK(file_size >= 8, where(), ": file is ", file_size,
            " bytes, shorter than the 8-byte header length field (truncated or not safetensors)");
  uint64_t header_len = read_le_u64(base);
  KBN_CHECK(header_len <= kMaxHeaderBytes, where(), ": header length ", header_len, " bytes is absurd (limit ",
            kMaxHeaderBytes, "); the file is corrupt or not safetensors");
  KBN_CHECK(header_len <= file_size - 8, where(), ": header length ", header_len, " bytes is larger than the ",
            file_size - 8, " bytes that follow it (truncated or corrupt file)");
  data_start = 8 + header_len;
  data_size = file_size - data_start;

  // nlohmann keeps the last of duplicate keys silently, so top-level keys are collected while parsing.
  std::set<std::string> seen_names;
  std::optional<std::string> duplicate_name;
  auto on_event = [&](int depth, ordered_json::parse_event_t event, ordered_json& parsed) {
    if (depth == 1 && event == ordered_json::parse_event_t::key && parsed.is_string()) {
      const auto& key = parsed.get_ref<const std::string&>();
      if (!seen_names.insert(key).second && !duplicate_name) duplicate_name = key;
    }
    return true;
  };
  const char* header_text = reinterpret_cast<const char*>(base + 8);
  ordered_json header;
  try {
    header = ordered_json::parse(header_text, header_text + header_len, on_event);
  } catch (const nlohmann::json::exception& e) {
    KBN_FAIL(where(), ": header is not valid JSON (", e.what(), ")");
  }
  KBN_CHECK(header.is_object(), where(), ": header must be a JSON object, got ", header.type_name());
  KBN_CHECK(!duplicate_name, where(), ": duplicate tensor name '", duplicate_name.value_or(""), "' in the header");

  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      KBN_CHECK(entry.is_object(), where(), ": \"__metadata__\" must be an object of strings, got ", entry.dump());
      for (const auto& [key, value] : entry.items()) {
        KBN_CHECK(value.is_string(), where(), ": \"__metadata__\" value for key '", key, "' must be a string, got ",
                  value.dump());
        metadata[key] = value.get<std::string>();
      }
      continue;
    }
    auto what = [&] { return where() + ": tensor '" + name + "'"; };
    KBN_CHECK(entry.is_object(), what(), ": entry must be an object with dtype, shape and data_offsets, got ",
              entry.dump());
    for (const char* key : {"dtype", "shape", "data_offsets"})
      KBN_CHECK(entry.contains(key), what(), ": entry is missing \"", key, "\"");

    TensorInfo info;
    info.name = name;
    const auto& dtype = entry["dtype"];
    KBN_CHECK(dtype.is_string(), what(), ": \"dtype\" must be a string, got ", dtype.dump());
    auto dt = dtype_from_safetensors(dtype.get<std::string>());
    KBN_CHECK(dt.has_value(), what(), ": dtype '", dtype.get<std::string>(),
              "' is not supported by kbn (supported: ", supported_dtype_list(), ")");
    info.dtype = *dt;

    const auto& shape = entry["shape"];
    KBN_CHECK(shape.is_array(), what(), ": \"shape\" must be a list of non-negative integers, got ", shape.dump());
    uint64_t numel = 1;
    bool numel_overflows = false;
    for (const auto& d : shape) {
      auto size = as_non_negative_int(d, uint64_t(INT64_MAX));
      KBN_CHECK(size.has_value(), what(), ": \"shape\" must be a list of non-negative integers, got ", shape.dump());
      info.shape.push_back(int64_t(*size));
      numel_overflows |= __builtin_mul_overflow(numel, *size, &numel);
    }
    uint64_t nbytes = 0;
    numel_overflows |= __builtin_mul_overflow(numel, uint64_t(dtype_size(info.dtype)), &nbytes);
    KBN_CHECK(!numel_overflows, what(), ": shape ", shape.dump(), " is too large");

    const auto& offsets = entry["data_offsets"];
    KBN_CHECK(offsets.is_array() && offsets.size() == 2, what(), ": \"data_offsets\" must be [begin, end], got ",
              offsets.dump());
    auto begin = as_non_negative_int(offsets[0], UINT64_MAX);
    auto end = as_non_negative_int(offsets[1], UINT64_MAX);
    KBN_CHECK(begin && end && *begin <= *end, what(),
              ": \"data_offsets\" must be [begin, end] with non-negative integers and begin <= end, got ",
              offsets.dump());
    info.begin = *begin;
    info.end = *end;
    KBN_CHECK(info.end <= data_size, what(), ": data_offsets ", offsets.dump(), " end beyond the data section (",
              data_size, " bytes; truncated or corrupt file)");
    KBN_CHECK(info.end - info.begin == nbytes, what(), ": data_offsets ", offsets.dump(), " span ",
              info.end - info.begin, " bytes but ", dtype.get<std::string>(), " ", shape.dump(), " needs ", nbytes,
              " bytes (size mismatch)");
    tensors.push_back(std::move(info));
  }

  // File order: ascending offset. Empty tensors occupy no bytes, so only non-empty ranges can overlap.
  std::stable_sort(tensors.begin(), tensors.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  const TensorInfo* previous = nullptr;
  for (const auto& t : tensors) {
    if (t.begin == t.end) continue;
    KBN_CHECK(!previous || t.begin >= previous->end, where(), ": tensors '", previous ? previous->name : "", "' [",
              previous ? previous->begin : 0, ", ", previous ? previous->end : 0, ") and '", t.name, "' [", t.begin,
              ", ", t.end, ") overlap in the data section");
    previous = &t;
  }
  for (size_t i = 0; i < tensors.size(); ++i) by_name.emplace(tensors[i].name, i);
}

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  auto st = std::make_shared<State>();
  st->path = path;
  FdCloser fd{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  KBN_CHECK(fd.fd >= 0, "safetensors file '", path, "': cannot open (", errno_text(), ")");
  struct stat sb {};
  KBN_CHECK(::fstat(fd.fd, &sb) == 0, "safetensors file '", path, "': cannot stat (", errno_text(), ")");
  KBN_CHECK(S_ISREG(sb.st_mode), "safetensors file '", path, "': not a regular file");
  st->file_size = size_t(sb.st_size);
  if (st->file_size > 0) {
    void* p = ::mmap(nullptr, st->file_size, PROT_READ, MAP_PRIVATE, fd.fd, 0);
    KBN_CHECK(p != MAP_FAILED, "safetensors file '", path, "': cannot map ", st->file_size, " bytes (", errno_text(),
              ")");
    st->base = static_cast<const uint8_t*>(p);
  }
  st->parse_header();
  SafetensorsFile f;
  f.state_ = std::move(st);
  return f;
}

const std::vector<TensorInfo>& SafetensorsFile::tensors() const { return state_->tensors; }

const TensorInfo* SafetensorsFile::find(const std::string& name) const {
  auto it = state_->by_name.find(name);
  return it == state_->by_name.end() ? nullptr : &state_->tensors[it->second];
}

const uint8_t* SafetensorsFile::data(const TensorInfo& info) const {
  KBN_CHECK(info.begin <= info.end && info.end <= state_->data_size, "safetensors file '", state_->path, "': tensor '",
            info.name, "' byte range [", info.begin, ", ", info.end, ") is not inside this file");
  return state_->base + state_->data_start + info.begin;
}

Tensor SafetensorsFile::load(const std::string& name) const {
  const TensorInfo* info = find(name);
  KBN_CHECK(info, "safetensors file '", state_->path, "': no tensor named '", name, "'");
  Tensor t = Tensor::empty(info->shape, info->dtype);
  if (info->end > info->begin) std::memcpy(t.data_ptr(), data(*info), info->end - info->begin);
  return t;
}

void SafetensorsFile::read_into(const std::string& name, const Tensor& dst) const {
  const TensorInfo* info = find(name);
  KBN_CHECK(info, "safetensors file '", state_->path, "': no tensor named '", name, "'");
  KBN_CHECK(dst.defined(), "safetensors file '", state_->path, "': read_into '", name, "': destination is undefined");
  // An empty destination holds no bytes, whatever its strides say.
  KBN_CHECK(dst.dtype() == info->dtype && dst.shape() == info->shape && (dst.numel() == 0 || dst.is_contiguous()),
            "safetensors file '", state_->path, "': read_into '", name, "': destination ", dst.str(),
            " must be contiguous ", dtype_name(info->dtype), shape_str(info->shape));
  if (info->end > info->begin)
    copy_bytes(dst.data_ptr(), dst.device(), data(*info), Device::cpu(), info->end - info->begin);
}

const std::map<std::string, std::string>& SafetensorsFile::metadata() const { return state_->metadata; }

const std::string& SafetensorsFile::path() const { return state_->path; }

// ---- Checkpoint ----

namespace {

constexpr const char* kIndexName = "model.safetensors.index.json";
constexpr const char* kSingleName = "model.safetensors";

std::string read_text_file(const std::string& path, const char* what) {
  std::ifstream f(path, std::ios::binary);
  KBN_CHECK(f.good(), what, " '", path, "': cannot open");
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace

Checkpoint Checkpoint::open(const std::string& path) {
  Checkpoint ckpt;
  ckpt.path_ = path;
  std::error_code ec;
  fs::file_status status = fs::status(path, ec);
  KBN_CHECK(fs::exists(status), "checkpoint '", path, "': no such file or directory");

  fs::path index_path;
  if (fs::is_directory(status)) {
    fs::path dir(path);
    if (fs::exists(dir / kIndexName)) {
      index_path = dir / kIndexName;
    } else {
      KBN_CHECK(fs::exists(dir / kSingleName), "checkpoint '", path, "': directory holds neither ", kIndexName, " nor ",
                kSingleName);
      ckpt.shards_.push_back(SafetensorsFile::open((dir / kSingleName).string()));
    }
  } else if (path.size() >= 5 && path.compare(path.size() - 5, 5, ".json") == 0) {
    index_path = path;
  } else {
    ckpt.shards_.push_back(SafetensorsFile::open(path));
  }

  if (index_path.empty()) {
    for (const auto& t : ckpt.shards_[0].tensors()) ckpt.shard_index_.emplace(t.name, 0);
    return ckpt;
  }

  const std::string index = index_path.string();
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(read_text_file(index, "checkpoint index"));
  } catch (const nlohmann::json::exception& e) {
    KBN_FAIL("checkpoint index '", index, "': not valid JSON (", e.what(), ")");
  }
  KBN_CHECK(j.is_object() && j.contains("weight_map") && j["weight_map"].is_object(), "checkpoint index '", index,
            "': missing the \"weight_map\" object (tensor name -> shard file)");

  // Shard file -> the tensor names the index puts there, in name order.
  std::map<std::string, std::vector<std::string>> names_by_shard;
  for (const auto& [name, shard] : j["weight_map"].items()) {
    KBN_CHECK(shard.is_string(), "checkpoint index '", index, "': weight_map entry for tensor '", name,
              "' must be a file name, got ", shard.dump());
    names_by_shard[shard.get<std::string>()].push_back(name);
  }
  for (const auto& [shard_file, names] : names_by_shard) {
    KBN_CHECK(!shard_file.empty() && fs::path(shard_file).is_relative(), "checkpoint index '", index, "': shard file '",
              shard_file, "' (for tensor '", names.front(), "') must be a path relative to the index");
    fs::path shard_path = index_path.parent_path() / shard_file;
    KBN_CHECK(fs::exists(shard_path), "checkpoint index '", index, "': weight_map names shard file '", shard_file,
              "' (for tensor '", names.front(), "'), which does not exist at '", shard_path.string(), "'");
    SafetensorsFile shard = SafetensorsFile::open(shard_path.string());
    for (const auto& name : names) {
      KBN_CHECK(shard.find(name), "checkpoint index '", index, "': weight_map puts tensor '", name, "' in shard file '",
                shard_file, "', which does not contain it");
      ckpt.shard_index_.emplace(name, ckpt.shards_.size());
    }
    ckpt.shards_.push_back(std::move(shard));
  }
  return ckpt;
}

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> out;
  out.reserve(shard_index_.size());
  for (const auto& [name, shard] : shard_index_) out.push_back(name);
  return out;
}

const SafetensorsFile& Checkpoint::shard_of(const std::string& name) const {
  auto it = shard_index_.find(name);
  KBN_CHECK(it != shard_index_.end(), "checkpoint '", path_, "': no tensor named '", name, "' (the checkpoint holds ",
            shard_index_.size(), " tensors)");
  return shards_[it->second];
}

const TensorInfo* Checkpoint::find(const std::string& name) const {
  auto it = shard_index_.find(name);
  return it == shard_index_.end() ? nullptr : shards_[it->second].find(name);
}

Tensor Checkpoint::load(const std::string& name) const { return shard_of(name).load(name); }

void Checkpoint::read_into(const std::string& name, const Tensor& dst) const { shard_of(name).read_into(name, dst); }

void Checkpoint::for_each(const std::function<void(const std::string&, const Tensor&)>& fn) const {
  for (const auto& [name, shard] : shard_index_) {
    Tensor t = shards_[shard].load(name);
    fn(name, t);
  }
}

// ---- writing ----

void save_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  std::set<std::string> names;
  for (const auto& [name, t] : tensors) {
    KBN_CHECK(!name.empty() && name != "__metadata__", "save_safetensors '", path, "': invalid tensor name '", name,
              "'");
    KBN_CHECK(names.insert(name).second, "save_safetensors '", path, "': tensor name '", name, "' appears twice");
    KBN_CHECK(t.defined(), "save_safetensors '", path, "': tensor '", name, "' is undefined");
  }

  // Larger elements first keeps every tensor aligned to its element size once the header is padded to 8.
  std::vector<size_t> order(tensors.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return tensors[a].second.element_size() > tensors[b].second.element_size();
  });

  ordered_json header = ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (size_t i : order) {
    const auto& [name, t] = tensors[i];
    uint64_t nbytes = t.nbytes();
    header[name] = {{"dtype", safetensors_dtype_name(t.dtype())},
                    {"shape", t.shape()},
                    {"data_offsets", {offset, offset + nbytes}}};
    offset += nbytes;
  }
  std::string header_text = header.dump();
  header_text.append((8 - header_text.size() % 8) % 8, ' ');

  const std::string partial = path + ".partial";
  {
    std::ofstream f(partial, std::ios::binary | std::ios::trunc);
    KBN_CHECK(f.good(), "save_safetensors '", path, "': cannot create '", partial, "' (", errno_text(), ")");
    uint8_t len[8];
    write_le_u64(len, header_text.size());
    f.write(reinterpret_cast<const char*>(len), 8);
    f.write(header_text.data(), std::streamsize(header_text.size()));
    for (size_t i : order) {
      const Tensor& t = tensors[i].second;
      if (t.numel() == 0) continue;
      Tensor host = t.is_cpu() ? t.contiguous() : t.to(Device::cpu());
      f.write(static_cast<const char*>(host.data_ptr()), std::streamsize(host.nbytes()));
    }
    f.flush();
    if (!f.good()) {
      std::string reason = errno_text();
      f.close();
      std::error_code ec;
      fs::remove(partial, ec);
      KBN_FAIL("save_safetensors '", path, "': write failed (", reason, ")");
    }
  }
  std::error_code ec;
  fs::rename(partial, path, ec);
  if (ec) {
    std::error_code ignored;
    fs::remove(partial, ignored);
    KBN_FAIL("save_safetensors '", path, "': cannot rename '", partial, "' into place (", ec.message(), ")");
  }
}

}  // namespace kbn
