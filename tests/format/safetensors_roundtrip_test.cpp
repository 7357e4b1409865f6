// Writer -> reader round trips, header layout, atomic writes and the folder/shard layouts.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "exl3/format/safetensors.hpp"
#include "exl3/trellis/half.hpp"
#include "format_test_util.hpp"
#include "test_support.hpp"

namespace exl3 {
namespace {

using test::error_of;
using test::filled;
using ::testing::HasSubstr;

const DType kAllDTypes[] = {DType::kBool, DType::kU8,  DType::kI8,     DType::kI16,
                            DType::kI32,  DType::kI64, DType::kF16,    DType::kBF16,
                            DType::kF32,  DType::kF64, DType::kF8E4M3, DType::kF8E5M2};

TEST(DType, NamesRoundTrip) {
  for (const DType d : kAllDTypes) {
    ASSERT_EQ(parse_dtype(dtype_name(d)), d) << dtype_name(d);
  }
  EXPECT_EQ(dtype_size(DType::kBF16), 2u);
  EXPECT_EQ(dtype_size(DType::kF8E4M3), 1u);
  EXPECT_EQ(dtype_size(DType::kI64), 8u);
  EXPECT_FALSE(parse_dtype("F128").has_value());
  EXPECT_FALSE(parse_dtype("f16").has_value());
}

TEST(SafetensorsRoundTrip, EveryDtypeWithRandomBytes) {
  test::TempDir dir;
  auto rng = test::make_rng();
  SafetensorsWriter w;
  std::map<std::string, std::vector<std::byte>> want;
  int i = 0;
  for (const DType d : kAllDTypes) {
    // Odd element counts so that the layout has to order tensors to keep each one aligned.
    const std::vector<int64_t> shape{3, 1 + i % 4};
    std::vector<std::byte> bytes(test::numel_of(shape) * dtype_size(d));
    for (auto& b : bytes) b = static_cast<std::byte>(rng() & 0xFF);
    const std::string name = fmt::format("t{}.{}", i++, dtype_name(d));
    w.add(name, d, shape, std::span<const std::byte>(bytes));
    want[name] = bytes;
  }
  w.add("empty", DType::kF32, {0, 5}, std::span<const std::byte>());
  w.add("scalar", DType::kI32, {}, std::span<const int32_t>(std::vector<int32_t>{-7}));
  w.write(dir / "all.safetensors");

  const auto f = SafetensorsFile::open(dir / "all.safetensors");
  ASSERT_EQ(f->tensors().size(), want.size() + 2);
  for (const auto& [name, bytes] : want) {
    const TensorInfo& t = f->at(name);
    const auto got = f->bytes(t);
    ASSERT_EQ(got.size(), bytes.size()) << name;
    EXPECT_TRUE(std::equal(got.begin(), got.end(), bytes.begin())) << name;
    // Every tensor starts at a multiple of its element size inside the 8-aligned data section.
    EXPECT_EQ(t.begin % dtype_size(t.dtype), 0u) << name;
  }
  EXPECT_EQ(f->at("empty").nbytes(), 0u);
  EXPECT_EQ(f->at("empty").numel(), 0);
  EXPECT_EQ(f->at("scalar").rank(), 0);
  EXPECT_EQ(f->at("scalar").numel(), 1);
  EXPECT_EQ(f->find("missing"), nullptr);
  EXPECT_THAT(error_of([&] { (void)f->at("missing"); }), HasSubstr("tensor 'missing'"));
}

TEST(SafetensorsRoundTrip, HeaderPaddedToEightWithSpacesAndKeysSorted) {
  SafetensorsWriter w;
  w.add("b", DType::kU8, {3}, std::span<const uint8_t>(std::vector<uint8_t>{1, 2, 3}));
  w.add("a", DType::kU8, {1}, std::span<const uint8_t>(std::vector<uint8_t>{9}));
  const std::string s = w.serialize();
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(s[static_cast<size_t>(i)]);
  EXPECT_EQ((8 + n) % 8, 0u);
  const std::string header = s.substr(8, n);
  EXPECT_LT(header.find("\"a\""), header.find("\"b\""));
  const size_t last = header.find_last_not_of(' ');
  EXPECT_EQ(header[last], '}');
  EXPECT_EQ(s.size(), 8 + n + 4);
}

TEST(SafetensorsRoundTrip, MetadataKept) {
  test::TempDir dir;
  SafetensorsWriter w;
  w.set_metadata("format", "pt");
  w.set_metadata("note", "h\xC3\xA9llo");  // UTF-8 survives
  w.add("x", DType::kF32, {2}, std::span<const float>(std::vector<float>{1.5f, -2.0f}));
  w.write(dir / "m.safetensors");
  const auto f = SafetensorsFile::open(dir / "m.safetensors");
  EXPECT_EQ(f->metadata().at("format"), "pt");
  EXPECT_EQ(f->metadata().at("note"), "h\xC3\xA9llo");
}

TEST(SafetensorsRoundTrip, WriterRejectsBadTensors) {
  SafetensorsWriter w;
  w.add("x", DType::kU8, {1}, std::span<const uint8_t>(std::vector<uint8_t>{1}));
  EXPECT_THAT(error_of([&] {
                w.add("x", DType::kU8, {1}, std::span<const uint8_t>(std::vector<uint8_t>{1}));
              }),
              HasSubstr("added twice"));
  EXPECT_THAT(error_of([&] {
                w.add("y", DType::kF32, {2}, std::span<const float>(std::vector<float>{1}));
              }),
              HasSubstr("tensor 'y'"));
  EXPECT_THAT(error_of([&] { w.add("z", DType::kU8, {-1}, std::span<const std::byte>()); }),
              HasSubstr("negative dim"));
}

TEST(SafetensorsRoundTrip, AtomicWriteLeavesNoTempFile) {
  test::TempDir dir;
  write_file_atomic(dir / "a.json", std::string_view("{\"k\": 1}"));
  write_file_atomic(dir / "a.json", std::string_view("{\"k\": 2}"));  // replaces
  EXPECT_EQ(test::read_file(dir / "a.json"), "{\"k\": 2}");
  int count = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) {
    ++count;
    EXPECT_EQ(e.path().filename(), "a.json");
  }
  EXPECT_EQ(count, 1);
}

TEST(SafetensorsRoundTrip, AtomicWriteFailureNamesPathAndErrno) {
  test::TempDir dir;
  const auto target = dir / "missing-folder" / "x.safetensors";
  const std::string msg = error_of([&] { write_file_atomic(target, std::string_view("abc")); });
  EXPECT_THAT(msg, HasSubstr(target.string()));
  EXPECT_THAT(msg, HasSubstr("No such file or directory"));
  // A rename onto a folder fails after the temp was written: the temp must be gone.
  std::filesystem::create_directories(dir / "occupied" / "inner");
  EXPECT_THAT(error_of([&] { write_file_atomic(dir / "occupied", std::string_view("abc")); }),
              HasSubstr("rename"));
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) {
    EXPECT_EQ(e.path().filename().string().find(".tmp."), std::string::npos) << e.path();
  }
}

TEST(SafetensorsRoundTrip, ReadAsFloatAndCopyTensor) {
  test::TempDir dir;
  SafetensorsWriter w;
  const std::vector<uint16_t> h{trellis::float_to_half(1.5f), trellis::float_to_half(-0.25f)};
  const std::vector<uint16_t> bf{trellis::float_to_bf16(3.0f), trellis::float_to_bf16(-8.0f)};
  w.add("h", DType::kF16, {2}, std::span<const uint16_t>(h));
  w.add("bf", DType::kBF16, {2}, std::span<const uint16_t>(bf));
  w.add("f", DType::kF32, {2}, std::span<const float>(std::vector<float>{0.5f, 7.0f}));
  w.add("d", DType::kF64, {1}, std::span<const double>(std::vector<double>{1e-300}));
  w.add("i", DType::kI32, {2}, std::span<const int32_t>(std::vector<int32_t>{-1, 5}));
  w.write(dir / "f.safetensors");
  const auto store = TensorStore::open(dir / "f.safetensors");
  EXPECT_EQ(read_as_float(store.at("h")), (std::vector<float>{1.5f, -0.25f}));
  EXPECT_EQ(read_as_float(store.at("bf")), (std::vector<float>{3.0f, -8.0f}));
  EXPECT_EQ(read_as_double(store.at("f")), (std::vector<double>{0.5, 7.0}));
  EXPECT_EQ(read_as_double(store.at("d")), (std::vector<double>{1e-300}));
  EXPECT_EQ(copy_tensor<int32_t>(store.at("i")), (std::vector<int32_t>{-1, 5}));
  EXPECT_EQ(copy_tensor<uint32_t>(store.at("i"))[0], 0xFFFFFFFFu);
  const std::string msg = error_of([&] { (void)read_as_float(store.at("i")); });
  EXPECT_THAT(msg, HasSubstr("tensor 'i'"));
  EXPECT_THAT(msg, HasSubstr("I32"));
  EXPECT_THAT(error_of([&] { (void)copy_tensor<double>(store.at("i")); }), HasSubstr("tensor 'i'"));
  EXPECT_EQ(store.total_bytes(), 4u + 4 + 8 + 8 + 8);
  EXPECT_THAT(error_of([&] { (void)store.at("nope"); }), HasSubstr("tensor 'nope'"));
}

// ---- folder layouts ----------------------------------------------------------------------------

void write_one(const std::filesystem::path& p, const std::vector<std::string>& names) {
  test::TensorMap m;
  for (const auto& n : names) m[n] = filled(DType::kF16, {4}, 0x3C00);
  test::write_tensors(p, m);
}

TEST(TensorStoreLayout, ShardedIndex) {
  test::TempDir dir;
  write_one(dir / "model-00001-of-00002.safetensors", {"a.weight", "b.weight"});
  write_one(dir / "model-00002-of-00002.safetensors", {"c.weight", "extra.weight"});
  write_file_atomic(dir / "model.safetensors.index.json",
                    std::string_view(R"({"metadata": {"total_size": 32}, "weight_map": {
      "a.weight": "model-00001-of-00002.safetensors", "b.weight": "model-00001-of-00002.safetensors",
      "c.weight": "model-00002-of-00002.safetensors"}})"));
  write_one(dir / "stray.safetensors", {"ignored"});  // the index decides which files count
  const auto s = TensorStore::open(dir.path());
  EXPECT_EQ(s.files().size(), 2u);
  // Tensors a shard holds beyond the weight_map are included.
  EXPECT_EQ(s.names(),
            (std::vector<std::string>{"a.weight", "b.weight", "c.weight", "extra.weight"}));
  EXPECT_EQ(s.at("c.weight").path().filename(), "model-00002-of-00002.safetensors");
  EXPECT_FALSE(s.contains("ignored"));
  EXPECT_EQ(s.size(), 4u);
}

TEST(TensorStoreLayout, ModelSafetensorsPreferredOverOtherFiles) {
  test::TempDir dir;
  write_one(dir / "model.safetensors", {"x"});
  write_one(dir / "reference.safetensors", {"y"});
  const auto s = TensorStore::open(dir.path());
  EXPECT_EQ(s.names(), std::vector<std::string>{"x"});
}

TEST(TensorStoreLayout, AllSafetensorsFilesSorted) {
  test::TempDir dir;
  write_one(dir / "b.safetensors", {"y"});
  write_one(dir / "a.safetensors", {"x"});
  const auto s = TensorStore::open(dir.path());
  ASSERT_EQ(s.files().size(), 2u);
  EXPECT_EQ(s.files()[0]->path().filename(), "a.safetensors");
  EXPECT_EQ(s.names(), (std::vector<std::string>{"x", "y"}));
}

TEST(TensorStoreLayout, FolderWithoutSafetensors) {
  test::TempDir dir;
  write_file_atomic(dir / "config.json", std::string_view("{}"));
  const std::string msg = error_of([&] { (void)TensorStore::open(dir.path()); });
  EXPECT_THAT(msg, HasSubstr(dir.path().string()));
  EXPECT_THAT(msg, HasSubstr("no safetensors files"));
}

TEST(TensorStoreLayout, MissingPathAndWrongExtension) {
  test::TempDir dir;
  EXPECT_THAT(error_of([&] { (void)TensorStore::open(dir / "nope"); }),
              HasSubstr("no such file or folder"));
  write_file_atomic(dir / "config.json", std::string_view("{}"));
  EXPECT_THAT(error_of([&] { (void)TensorStore::open(dir / "config.json"); }),
              HasSubstr("not a .safetensors file"));
}

TEST(TensorStoreLayout, InMemoryFiles) {
  const std::string bytes = test::serialize({{"w", filled(DType::kI16, {2}, 7)}});
  std::vector<std::byte> buf(bytes.size());
  std::memcpy(buf.data(), bytes.data(), bytes.size());
  const auto f = SafetensorsFile::from_bytes(std::move(buf), "mem");
  const auto s = TensorStore::from_files({f}, "mem");
  EXPECT_EQ(copy_tensor<int16_t>(s.at("w")), (std::vector<int16_t>{7, 7}));
  EXPECT_THAT(error_of([&] {
                (void)TensorStore::from_files({f, f}, "mem2");
              }),
              HasSubstr("stored twice"));
}

}  // namespace
}  // namespace exl3
