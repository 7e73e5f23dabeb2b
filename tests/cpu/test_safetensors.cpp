#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "kbn/safetensors.h"
#include "test_errors.h"

using namespace kbn;
using kbn::test::error_of;
namespace fs = std::filesystem;

namespace {

// A fresh directory under the system temp directory, removed with everything in it at the end of the test.
class TempDir {
 public:
  TempDir() {
    static std::atomic<int> counter{0};
    path_ = fs::temp_directory_path() /
            ("kbn_safetensors_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), std::streamsize(bytes.size()));
  ASSERT_TRUE(f.good()) << path;
}

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

std::string le64(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[size_t(i)] = char(uint8_t(v >> (8 * i)));
  return s;
}

template <class T>
std::string le_bytes(T v) {
  std::string s(sizeof(T), '\0');
  std::memcpy(s.data(), &v, sizeof(T));  // the test host is little-endian like every target of kb-nano
  return s;
}

// A safetensors file with `header` as the JSON text and `data` as the data section.
std::string safetensors_bytes(const std::string& header, const std::string& data) {
  return le64(header.size()) + header + data;
}

void expect_contains(const std::string& message, const std::vector<std::string>& parts) {
  for (const auto& p : parts) EXPECT_NE(message.find(p), std::string::npos) << "'" << p << "' not in: " << message;
}

std::string bytes_of(const Tensor& t) {
  Tensor c = t.contiguous();
  return std::string(static_cast<const char*>(c.data_ptr()), c.nbytes());
}

// A CPU tensor of arbitrary bit patterns (NaN payloads included), so a round trip must preserve raw bytes.
Tensor random_bits(const Shape& shape, DType dtype, uint32_t seed) {
  Tensor t = Tensor::empty(shape, dtype);
  std::mt19937 rng(seed);
  auto* p = static_cast<uint8_t*>(t.data_ptr());
  for (size_t i = 0; i < t.nbytes(); ++i) p[i] = uint8_t(rng());
  if (dtype == DType::boolean)
    for (size_t i = 0; i < t.nbytes(); ++i) p[i] &= 1;
  return t;
}

}  // namespace

TEST(Safetensors, RoundTripsEveryDTypeAndShape) {
  TempDir dir;
  const std::vector<Shape> shapes = {{}, {0}, {1}, {7}, {3, 5}, {2, 3, 5}, {3, 0, 2}, {1, 1, 769}};
  std::vector<std::pair<std::string, Tensor>> tensors;
  uint32_t seed = 1;
  for (DType dt : kAllDTypes)
    for (size_t i = 0; i < shapes.size(); ++i)
      tensors.emplace_back(std::string(dtype_name(dt)) + "." + std::to_string(i), random_bits(shapes[i], dt, seed++));
  const std::string path = dir.file("all.safetensors");
  save_safetensors(path, tensors);

  SafetensorsFile f = SafetensorsFile::open(path);
  ASSERT_EQ(f.tensors().size(), tensors.size());
  EXPECT_TRUE(f.metadata().empty());
  EXPECT_EQ(f.path(), path);
  uint64_t previous_begin = 0;
  for (const auto& info : f.tensors()) {
    EXPECT_GE(info.begin, previous_begin) << "tensors() must be in file order";
    previous_begin = info.begin;
    EXPECT_EQ(info.begin % dtype_size(info.dtype), 0u) << info.name << " is not aligned to its element size";
  }
  for (const auto& [name, original] : tensors) {
    const TensorInfo* info = f.find(name);
    ASSERT_NE(info, nullptr) << name;
    EXPECT_EQ(info->dtype, original.dtype()) << name;
    EXPECT_EQ(info->shape, original.shape()) << name;
    EXPECT_EQ(info->end - info->begin, original.nbytes()) << name;
    Tensor loaded = f.load(name);
    EXPECT_TRUE(loaded.is_cpu());
    // Tensor::is_contiguous() reports a fresh [3, 0, 2] tensor as strided, so only non-empty ones are checked.
    EXPECT_TRUE(loaded.numel() == 0 || loaded.is_contiguous()) << name;
    EXPECT_EQ(loaded.dtype(), original.dtype()) << name;
    EXPECT_EQ(loaded.shape(), original.shape()) << name;
    EXPECT_EQ(bytes_of(loaded), bytes_of(original)) << name;
  }
  EXPECT_EQ(f.find("absent"), nullptr);
}

TEST(Safetensors, WritesStridedViewsAsTheirLogicalValues) {
  TempDir dir;
  Tensor base = Tensor::from_floats({0, 1, 2, 3, 4, 5}, {2, 3});
  Tensor transposed = base.transpose(0, 1);  // [3, 2], not contiguous
  Tensor row = base.select(0, 1);            // [3], offset 3
  const std::string path = dir.file("views.safetensors");
  save_safetensors(path, {{"transposed", transposed}, {"row", row}});
  SafetensorsFile f = SafetensorsFile::open(path);
  EXPECT_EQ(f.load("transposed").to_floats(), (std::vector<float>{0, 3, 1, 4, 2, 5}));
  EXPECT_EQ(f.load("row").to_floats(), (std::vector<float>{3, 4, 5}));
}

TEST(Safetensors, LoadedTensorOutlivesTheFile) {
  TempDir dir;
  const std::string path = dir.file("x.safetensors");
  save_safetensors(path, {{"x", Tensor::from_floats({1, 2, 3}, {3}, DType::bf16)}});
  Tensor loaded;
  {
    SafetensorsFile f = SafetensorsFile::open(path);
    SafetensorsFile copy = f;  // copies share the mapping
    loaded = copy.load("x");
  }
  fs::remove(path);
  EXPECT_EQ(loaded.to_floats(), (std::vector<float>{1, 2, 3}));
}

TEST(Safetensors, MetadataRoundTrips) {
  TempDir dir;
  const std::map<std::string, std::string> metadata = {
      {"format", "pt"}, {"note", "quotes \" and \\ and unicode \xc3\xbc"}, {"empty", ""}};
  const std::string path = dir.file("meta.safetensors");
  save_safetensors(path, {{"w", Tensor::from_i32({1, 2}, {2})}}, metadata);
  SafetensorsFile f = SafetensorsFile::open(path);
  EXPECT_EQ(f.metadata(), metadata);
  EXPECT_EQ(f.load("w").to_ints(), (std::vector<int64_t>{1, 2}));

  save_safetensors(path, {}, metadata);  // metadata only, empty data section
  SafetensorsFile only_metadata = SafetensorsFile::open(path);
  EXPECT_TRUE(only_metadata.tensors().empty());
  EXPECT_EQ(only_metadata.metadata(), metadata);
}

TEST(Safetensors, ReadsAHandWrittenFileBySpec) {
  TempDir dir;
  // Header keys deliberately not in data order; the spec allows trailing spaces in the header.
  const std::string header = R"({"__metadata__":{"format":"pt"},)"
                             R"("b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]},)"
                             R"("a":{"dtype":"I64","shape":[],"data_offsets":[0,8]},)"
                             R"("c":{"dtype":"BF16","shape":[1,2],"data_offsets":[16,20]},)"
                             R"("d":{"dtype":"F16","shape":[1],"data_offsets":[20,22]},)"
                             R"("e":{"dtype":"I32","shape":[1],"data_offsets":[22,26]},)"
                             R"("f":{"dtype":"BOOL","shape":[2],"data_offsets":[26,28]},)"
                             R"("g":{"dtype":"F8_E4M3","shape":[2],"data_offsets":[28,30]},)"
                             R"("h":{"dtype":"U8","shape":[2],"data_offsets":[30,32]},)"
                             R"("z":{"dtype":"F32","shape":[0,4],"data_offsets":[32,32]}}    )";
  const std::string data = le_bytes<int64_t>(-7) + le_bytes<float>(1.5f) + le_bytes<float>(-2.0f) +
                           le_bytes<uint16_t>(0x3f80) + le_bytes<uint16_t>(0xc000) +  // bf16 1.0, -2.0
                           le_bytes<uint16_t>(0x3c00) +                               // f16 1.0
                           le_bytes<int32_t>(123456) + std::string("\x01\x00", 2) +
                           std::string("\x7e\xb8", 2) +  // fp8 e4m3 448, -1.0
                           std::string("\xff\x10", 2);
  const std::string path = dir.file("hand_written.safetensors");
  write_file(path, safetensors_bytes(header, data));

  SafetensorsFile f = SafetensorsFile::open(path);
  std::vector<std::string> order;
  for (const auto& t : f.tensors()) order.push_back(t.name);
  EXPECT_EQ(order, (std::vector<std::string>{"a", "b", "c", "d", "e", "f", "g", "h", "z"}));
  EXPECT_EQ(f.metadata(), (std::map<std::string, std::string>{{"format", "pt"}}));
  const TensorInfo* b = f.find("b");
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->dtype, DType::f32);
  EXPECT_EQ(b->shape, (Shape{2}));
  EXPECT_EQ(b->begin, 8u);
  EXPECT_EQ(b->end, 16u);

  Tensor a = f.load("a");
  EXPECT_EQ(a.dim(), 0);
  EXPECT_EQ(a.to_ints(), (std::vector<int64_t>{-7}));
  EXPECT_EQ(f.load("b").to_floats(), (std::vector<float>{1.5f, -2.0f}));
  Tensor c = f.load("c");
  EXPECT_EQ(c.shape(), (Shape{1, 2}));
  EXPECT_EQ(c.to_floats(), (std::vector<float>{1.0f, -2.0f}));
  EXPECT_EQ(f.load("d").to_floats(), (std::vector<float>{1.0f}));
  EXPECT_EQ(f.load("e").to_ints(), (std::vector<int64_t>{123456}));
  EXPECT_EQ(f.load("f").to_ints(), (std::vector<int64_t>{1, 0}));
  EXPECT_EQ(f.load("g").to_floats(), (std::vector<float>{448.0f, -1.0f}));
  EXPECT_EQ(f.load("h").to_ints(), (std::vector<int64_t>{255, 16}));
  EXPECT_EQ(f.load("z").shape(), (Shape{0, 4}));
}

TEST(Safetensors, WritesTheSpecLayoutByteForByte) {
  TempDir dir;
  const std::string path = dir.file("written.safetensors");
  // Larger elements are laid out first (i64, then f32, then u8); metadata leads the header.
  save_safetensors(path,
                   {{"small", Tensor::from_floats({3}, {1}, DType::u8)},
                    {"x", Tensor::from_floats({1.0f, -2.0f}, {2})},
                    {"ids", Tensor::from_i64({5}, {1})}},
                   {{"format", "pt"}});
  std::string header = R"({"__metadata__":{"format":"pt"},)"
                       R"("ids":{"dtype":"I64","shape":[1],"data_offsets":[0,8]},)"
                       R"("x":{"dtype":"F32","shape":[2],"data_offsets":[8,16]},)"
                       R"("small":{"dtype":"U8","shape":[1],"data_offsets":[16,17]}})";
  header.append((8 - header.size() % 8) % 8, ' ');
  const std::string expected =
      safetensors_bytes(header, le_bytes<int64_t>(5) + le_bytes<float>(1.0f) + le_bytes<float>(-2.0f) + "\x03");
  EXPECT_EQ(read_file(path), expected);
  EXPECT_FALSE(fs::exists(path + ".partial"));
}

TEST(Safetensors, ReadIntoCopiesIntoAnExistingTensor) {
  TempDir dir;
  const std::string path = dir.file("r.safetensors");
  save_safetensors(path, {{"w", Tensor::from_floats({1, 2, 3, 4}, {2, 2}, DType::f16)}});
  SafetensorsFile f = SafetensorsFile::open(path);
  Tensor dst = Tensor::zeros({2, 2}, DType::f16);
  f.read_into("w", dst);
  EXPECT_EQ(dst.to_floats(), (std::vector<float>{1, 2, 3, 4}));
  Tensor wrong = Tensor::zeros({4}, DType::f16);
  expect_contains(error_of([&] { f.read_into("w", wrong); }), {"r.safetensors", "'w'", "[2, 2]"});
  expect_contains(error_of([&] { f.load("nope"); }), {"r.safetensors", "'nope'"});
}

TEST(Safetensors, SaveRefusesBadNames) {
  TempDir dir;
  const std::string path = dir.file("bad.safetensors");
  Tensor t = Tensor::from_floats({1}, {1});
  using Named = std::vector<std::pair<std::string, Tensor>>;
  auto save_error = [&](const Named& tensors) { return error_of([&] { save_safetensors(path, tensors); }); };
  expect_contains(save_error({{"a", t}, {"a", t}}), {"bad.safetensors", "'a'", "twice"});
  expect_contains(save_error({{"__metadata__", t}}), {"bad.safetensors", "__metadata__"});
  expect_contains(save_error({{"", t}}), {"bad.safetensors", "invalid"});
  expect_contains(save_error({{"u", Tensor()}}), {"bad.safetensors", "'u'", "undefined"});
  EXPECT_FALSE(fs::exists(path));
}

// ---- corrupt files: every case must be a kbn::Error naming the file and the problem ----

namespace {

struct CorruptCase {
  std::string name;
  std::string bytes;
  std::vector<std::string> expected;  // substrings of the message, besides the file name
};

std::string tensor_entry(const std::string& dtype, const std::string& shape, const std::string& offsets) {
  return R"({"dtype":")" + dtype + R"(","shape":)" + shape + R"(,"data_offsets":)" + offsets + "}";
}

std::vector<CorruptCase> corrupt_cases() {
  const std::string eight_bytes(8, '\x11');
  return {
      {"short", std::string("\x05\x00\x00", 3), {"3 bytes", "shorter"}},
      {"empty", "", {"0 bytes", "shorter"}},
      {"header_past_end", le64(1000) + R"({"a":1})", {"header length 1000", "truncated"}},
      {"header_absurd", le64(uint64_t(1) << 40) + std::string(64, ' '), {"absurd"}},
      {"header_not_json", safetensors_bytes("{not json", ""), {"not valid JSON"}},
      {"header_empty", safetensors_bytes("", ""), {"not valid JSON"}},
      {"header_not_object", safetensors_bytes("[1,2]", ""), {"JSON object"}},
      {"entry_not_object", safetensors_bytes(R"({"a":[1]})", ""), {"'a'", "must be an object"}},
      {"missing_dtype",
       safetensors_bytes(R"({"a":{"shape":[2],"data_offsets":[0,8]}})", eight_bytes),
       {"'a'", "missing", "dtype"}},
      {"missing_shape",
       safetensors_bytes(R"({"a":{"dtype":"F32","data_offsets":[0,8]}})", eight_bytes),
       {"'a'", "missing", "shape"}},
      {"missing_offsets",
       safetensors_bytes(R"({"a":{"dtype":"F32","shape":[2]}})", eight_bytes),
       {"'a'", "missing", "data_offsets"}},
      {"dtype_not_string",
       safetensors_bytes(R"({"a":{"dtype":5,"shape":[2],"data_offsets":[0,8]}})", eight_bytes),
       {"'a'", "dtype", "string"}},
      {"dtype_f64",
       safetensors_bytes(R"({"a":)" + tensor_entry("F64", "[1]", "[0,8]") + "}", eight_bytes),
       {"'a'", "F64", "not supported"}},
      {"dtype_i16",
       safetensors_bytes(R"({"a":)" + tensor_entry("I16", "[4]", "[0,8]") + "}", eight_bytes),
       {"'a'", "I16", "not supported"}},
      {"dtype_i8",
       safetensors_bytes(R"({"a":)" + tensor_entry("I8", "[8]", "[0,8]") + "}", eight_bytes),
       {"'a'", "I8", "not supported"}},
      {"dtype_unknown",
       safetensors_bytes(R"({"a":)" + tensor_entry("Q7", "[8]", "[0,8]") + "}", eight_bytes),
       {"'a'", "Q7", "not supported"}},
      {"shape_negative",
       safetensors_bytes(R"({"a":)" + tensor_entry("F32", "[-2]", "[0,8]") + "}", eight_bytes),
       {"'a'", "shape", "non-negative"}},
      {"shape_fraction",
       safetensors_bytes(R"({"a":)" + tensor_entry("F32", "[2.5]", "[0,8]") + "}", eight_bytes),
       {"'a'", "shape", "integers"}},
      {"shape_string",
       safetensors_bytes(R"({"a":)" + tensor_entry("F32", R"(["2"])", "[0,8]") + "}", eight_bytes),
       {"'a'", "shape", "integers"}},
      {"shape_not_list",
       safetensors_bytes(R"({"a":)" + tensor_entry("F32", "2", "[0,8]") + "}", eight_bytes),
       {"'a'", "shape"}},
      {"shape_overflow",
       safetensors_bytes(R"({"a":)" + tensor_entry("F32", "[4294967296,4294967296]", "[0,8]") + "}", eight_bytes),
       {"'a'", "too large"}},
      {"offsets_one_value",
       safetensors_bytes(R"({"a":)" + tensor_entry("F32", "[2]", "[8]") + "}", eight_bytes),
       {"'a'", "[begin, end]"}},
      {"offsets_reversed",
       safetensors_bytes(R"({"a":)" + tensor_entry("F32", "[2]", "[8,0]") + "}", eight_bytes),
       {"'a'", "begin <= end"}},
      {"offsets_negative",
       safetensors_bytes(R"({"a":)" + tensor_entry("F32", "[2]", "[-8,0]") + "}", eight_bytes),
       {"'a'", "non-negative"}},
      {"offsets_fraction",
       safetensors_bytes(R"({"a":)" + tensor_entry("F32", "[2]", "[0,8.0]") + "}", eight_bytes),
       {"'a'", "data_offsets"}},
      {"end_beyond_data",
       safetensors_bytes(R"({"a":)" + tensor_entry("F32", "[4]", "[0,16]") + "}", eight_bytes),
       {"'a'", "beyond the data section"}},
      {"size_mismatch",
       safetensors_bytes(R"({"a":)" + tensor_entry("F32", "[3]", "[0,8]") + "}", eight_bytes),
       {"'a'", "12 bytes", "mismatch"}},
      {"overlap",
       safetensors_bytes(
           R"({"a":)" + tensor_entry("F32", "[2]", "[0,8]") + R"(,"b":)" + tensor_entry("F32", "[1]", "[4,8]") + "}",
           eight_bytes),
       {"'a'", "'b'", "overlap"}},
      {"duplicate",
       safetensors_bytes(
           R"({"a":)" + tensor_entry("F32", "[1]", "[0,4]") + R"(,"a":)" + tensor_entry("F32", "[1]", "[4,8]") + "}",
           eight_bytes),
       {"'a'", "duplicate"}},
      {"metadata_not_object", safetensors_bytes(R"({"__metadata__":[1]})", ""), {"__metadata__", "object"}},
      {"metadata_not_string", safetensors_bytes(R"({"__metadata__":{"n":1}})", ""), {"__metadata__", "'n'", "string"}},
  };
}

}  // namespace

TEST(SafetensorsCorrupt, EveryCaseNamesTheFileAndTheProblem) {
  TempDir dir;
  for (const auto& c : corrupt_cases()) {
    SCOPED_TRACE(c.name);
    const std::string path = dir.file("corrupt_" + c.name + ".safetensors");
    write_file(path, c.bytes);
    std::string message = error_of([&] { SafetensorsFile::open(path); });
    expect_contains(message, c.expected);
    expect_contains(message, {"corrupt_" + c.name + ".safetensors"});
    // A checkpoint over the same file reports the same problem.
    expect_contains(error_of([&] { Checkpoint::open(path); }), c.expected);
  }
}

TEST(SafetensorsCorrupt, TruncatedDataSection) {
  TempDir dir;
  const std::string path = dir.file("truncated.safetensors");
  save_safetensors(path, {{"w", Tensor::zeros({64}, DType::f32)}});
  std::string bytes = read_file(path);
  write_file(path, bytes.substr(0, bytes.size() - 10));
  expect_contains(error_of([&] { SafetensorsFile::open(path); }),
                  {"truncated.safetensors", "'w'", "beyond the data section"});
}

// Every truncation and many random byte flips of a valid file either open (and then load every tensor) or
// raise kbn::Error; none may crash or throw anything else.
TEST(SafetensorsCorrupt, TruncationsAndByteFlipsNeverCrash) {
  TempDir dir;
  const std::string path = dir.file("mutated.safetensors");
  save_safetensors(path,
                   {{"a", Tensor::from_floats({1, 2, 3}, {3}, DType::bf16)},
                    {"b", Tensor::from_i64({4, 5}, {2, 1})},
                    {"c", Tensor::zeros({0}, DType::u8)}},
                   {{"format", "pt"}});
  const std::string valid = read_file(path);
  auto try_open = [&](const std::string& bytes) {
    write_file(path, bytes);
    try {
      SafetensorsFile f = SafetensorsFile::open(path);
      for (const auto& t : f.tensors()) f.load(t.name);
      return true;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("mutated.safetensors"), std::string::npos) << e.what();
      return false;
    }
  };
  for (size_t n = 0; n < valid.size(); ++n) EXPECT_FALSE(try_open(valid.substr(0, n))) << "truncated to " << n;
  std::mt19937 rng(1234);
  for (int i = 0; i < 2000; ++i) {
    std::string bytes = valid;
    for (int flips = 1 + int(rng() % 3); flips > 0; --flips) bytes[rng() % bytes.size()] = char(rng());
    try_open(bytes);
  }
  EXPECT_TRUE(try_open(valid));
}

TEST(SafetensorsCorrupt, MissingFileAndDirectory) {
  TempDir dir;
  expect_contains(error_of([&] { SafetensorsFile::open(dir.file("nope.safetensors")); }),
                  {"nope.safetensors", "cannot open"});
  expect_contains(error_of([&] { SafetensorsFile::open(dir.path().string()); }), {dir.path().string(), "regular file"});
}

// ---- checkpoints ----

namespace {

// Two shards and an index as Hugging Face writes them; returns the tensors by name.
std::map<std::string, Tensor> write_sharded_checkpoint(const TempDir& dir) {
  std::map<std::string, Tensor> tensors = {
      {"model.embed_tokens.weight", Tensor::from_floats({1, 2, 3, 4, 5, 6}, {3, 2}, DType::bf16)},
      {"model.layers.0.input_layernorm.weight", Tensor::from_floats({0.5f, 0.25f}, {2}, DType::f32)},
      {"model.norm.weight", Tensor::from_floats({7, 8}, {2}, DType::bf16)},
      {"lm_head.weight", Tensor::from_floats({-1, -2, -3, -4, -5, -6}, {3, 2}, DType::f16)},
  };
  save_safetensors(dir.file("model-00001-of-00002.safetensors"),
                   {{"model.embed_tokens.weight", tensors["model.embed_tokens.weight"]},
                    {"model.layers.0.input_layernorm.weight", tensors["model.layers.0.input_layernorm.weight"]}});
  save_safetensors(dir.file("model-00002-of-00002.safetensors"), {{"model.norm.weight", tensors["model.norm.weight"]},
                                                                  {"lm_head.weight", tensors["lm_head.weight"]}});
  write_file(dir.file("model.safetensors.index.json"), R"({
  "metadata": {"total_size": 40},
  "weight_map": {
    "lm_head.weight": "model-00002-of-00002.safetensors",
    "model.embed_tokens.weight": "model-00001-of-00002.safetensors",
    "model.layers.0.input_layernorm.weight": "model-00001-of-00002.safetensors",
    "model.norm.weight": "model-00002-of-00002.safetensors"
  }
})");
  return tensors;
}

}  // namespace

TEST(Checkpoint, ShardedWithIndex) {
  TempDir dir;
  auto tensors = write_sharded_checkpoint(dir);
  for (const std::string& path : {dir.path().string(), dir.file("model.safetensors.index.json")}) {
    SCOPED_TRACE(path);
    Checkpoint ckpt = Checkpoint::open(path);
    EXPECT_EQ(ckpt.names(), (std::vector<std::string>{"lm_head.weight", "model.embed_tokens.weight",
                                                      "model.layers.0.input_layernorm.weight", "model.norm.weight"}));
    for (const auto& [name, t] : tensors) {
      Tensor loaded = ckpt.load(name);
      EXPECT_EQ(loaded.dtype(), t.dtype()) << name;
      EXPECT_EQ(bytes_of(loaded), bytes_of(t)) << name;
      ASSERT_NE(ckpt.find(name), nullptr);
      EXPECT_EQ(ckpt.find(name)->shape, t.shape());
    }
    std::vector<std::string> visited;
    ckpt.for_each([&](const std::string& name, const Tensor& t) {
      visited.push_back(name);
      EXPECT_EQ(bytes_of(t), bytes_of(tensors.at(name))) << name;
    });
    EXPECT_EQ(visited, ckpt.names());
    Tensor dst = Tensor::empty({2}, DType::bf16);
    ckpt.read_into("model.norm.weight", dst);
    EXPECT_EQ(dst.to_floats(), (std::vector<float>{7, 8}));
    EXPECT_EQ(ckpt.find("missing.weight"), nullptr);
    expect_contains(error_of([&] { ckpt.load("missing.weight"); }), {"missing.weight", path});
  }
}

TEST(Checkpoint, SingleFileAndDirectory) {
  TempDir dir;
  save_safetensors(dir.file("model.safetensors"),
                   {{"b", Tensor::from_i64({1, 2}, {2})}, {"a", Tensor::from_i32({3}, {1})}});
  for (const std::string& path : {dir.path().string(), dir.file("model.safetensors")}) {
    Checkpoint ckpt = Checkpoint::open(path);
    EXPECT_EQ(ckpt.path(), path);
    EXPECT_EQ(ckpt.names(), (std::vector<std::string>{"a", "b"}));
    EXPECT_EQ(ckpt.load("b").to_ints(), (std::vector<int64_t>{1, 2}));
    expect_contains(error_of([&] { ckpt.load("c"); }), {"'c'", path});
  }
  TempDir empty;
  expect_contains(error_of([&] { Checkpoint::open(empty.path().string()); }),
                  {empty.path().string(), "model.safetensors.index.json", "model.safetensors"});
  expect_contains(error_of([&] { Checkpoint::open(empty.file("absent")); }), {"absent", "no such file"});
}

TEST(CheckpointCorrupt, IndexProblemsNameTheIndexAndTheProblem) {
  struct IndexCase {
    std::string name;
    std::string index;
    std::vector<std::string> expected;
  };
  const std::vector<IndexCase> cases = {
      {"no_weight_map", R"({"metadata": {}})", {"weight_map"}},
      {"weight_map_not_object", R"({"weight_map": ["a"]})", {"weight_map"}},
      {"not_json", R"({"weight_map": )", {"not valid JSON"}},
      {"shard_missing",
       R"({"weight_map": {"model.norm.weight": "model-00009-of-00009.safetensors"}})",
       {"model-00009-of-00009.safetensors", "model.norm.weight", "does not exist"}},
      {"tensor_not_in_shard",
       R"({"weight_map": {"model.extra.weight": "model-00001-of-00002.safetensors"}})",
       {"model.extra.weight", "model-00001-of-00002.safetensors", "does not contain"}},
      {"shard_not_string", R"({"weight_map": {"model.norm.weight": 2}})", {"model.norm.weight", "file name"}},
      {"shard_absolute", R"({"weight_map": {"model.norm.weight": "/etc/passwd"}})", {"/etc/passwd", "relative"}},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    TempDir dir;
    write_sharded_checkpoint(dir);
    write_file(dir.file("model.safetensors.index.json"), c.index);
    std::string message = error_of([&] { Checkpoint::open(dir.path().string()); });
    expect_contains(message, c.expected);
    expect_contains(message, {dir.file("model.safetensors.index.json")});
  }
}

TEST(CheckpointCorrupt, CorruptShardNamesTheShard) {
  TempDir dir;
  write_sharded_checkpoint(dir);
  write_file(dir.file("model-00002-of-00002.safetensors"), "xyz");
  expect_contains(error_of([&] { Checkpoint::open(dir.path().string()); }),
                  {"model-00002-of-00002.safetensors", "shorter"});
}
