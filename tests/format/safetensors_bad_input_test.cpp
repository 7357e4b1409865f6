// One test per malformed safetensors input: each must fail with an exl3::Error that names the
// file and the tensor or header problem.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "exl3/format/safetensors.hpp"
#include "format_test_util.hpp"
#include "test_support.hpp"

namespace exl3 {
namespace {

using test::error_of;
using test::raw_file;
using ::testing::AllOf;
using ::testing::HasSubstr;

class BadSafetensors : public ::testing::Test {
 protected:
  // Writes `bytes` as bad.safetensors and returns the error of opening it.
  std::string open_error(const std::string& bytes) {
    path_ = dir_ / "bad.safetensors";
    test::write_file(path_, bytes);
    return error_of([&] { (void)SafetensorsFile::open(path_); });
  }
  std::string file() const { return path_.string(); }

  test::TempDir dir_;
  std::filesystem::path path_;
};

constexpr const char* kOk = R"("ok": {"dtype": "F16", "shape": [2], "data_offsets": [0, 4]})";

TEST_F(BadSafetensors, EmptyFile) {
  EXPECT_THAT(open_error(""),
              AllOf(HasSubstr(file()), HasSubstr("shorter than the 8-byte header length")));
}

TEST_F(BadSafetensors, ShorterThanEightBytes) {
  EXPECT_THAT(open_error(std::string("\x05\0\0", 3)),
              AllOf(HasSubstr(file()), HasSubstr("file is 3 bytes")));
}

TEST_F(BadSafetensors, HeaderCutOff) {
  const std::string full = raw_file(std::string("{") + kOk + "}", 4);
  EXPECT_THAT(open_error(full.substr(0, 20)),
              AllOf(HasSubstr(file()), HasSubstr("runs past the end")));
}

TEST_F(BadSafetensors, HeaderLengthPastEnd) {
  std::string bytes = raw_file("{}");
  bytes[0] = 100;  // claims 100 header bytes, file has 2
  EXPECT_THAT(open_error(bytes),
              AllOf(HasSubstr(file()), HasSubstr("header length 100 runs past")));
}

TEST_F(BadSafetensors, HeaderLengthOver100MiB) {
  std::string bytes = raw_file("{}");
  bytes[3] = 0x07;  // 0x07000002 > 100 MiB
  EXPECT_THAT(open_error(bytes), AllOf(HasSubstr(file()), HasSubstr("exceeds the 100 MiB limit")));
}

TEST_F(BadSafetensors, InvalidUtf8InHeader) {
  const std::string header =
      "{\"bad\xFF\xFEname\": {\"dtype\": \"U8\", \"shape\": [0], \"data_offsets\": [0, 0]}}";
  EXPECT_THAT(open_error(raw_file(header)),
              AllOf(HasSubstr(file()), HasSubstr("header: invalid JSON")));
}

TEST_F(BadSafetensors, InvalidJsonSyntax) {
  EXPECT_THAT(open_error(raw_file("{\"a\": ")),
              AllOf(HasSubstr(file()), HasSubstr("invalid JSON")));
}

TEST_F(BadSafetensors, HeaderNotAnObject) {
  EXPECT_THAT(open_error(raw_file("[1, 2]")),
              AllOf(HasSubstr(file()), HasSubstr("must be a JSON object, got an array")));
}

TEST_F(BadSafetensors, DeeplyNestedHeader) {
  EXPECT_THAT(open_error(raw_file(std::string(5000, '[') + std::string(5000, ']'))),
              AllOf(HasSubstr(file()), HasSubstr("nested deeper")));
}

TEST_F(BadSafetensors, DuplicateTensorName) {
  const std::string h = std::string("{") + kOk + ", " + kOk + "}";
  EXPECT_THAT(open_error(raw_file(h, 4)),
              AllOf(HasSubstr(file()), HasSubstr("key 'ok' appears twice")));
}

TEST_F(BadSafetensors, EntryNotAnObject) {
  EXPECT_THAT(open_error(raw_file(R"({"t": [1]})")),
              AllOf(HasSubstr(file()), HasSubstr("tensor 't': entry must be an object")));
}

TEST_F(BadSafetensors, MissingKey) {
  EXPECT_THAT(open_error(raw_file(R"({"t": {"dtype": "U8", "shape": [0]}})")),
              AllOf(HasSubstr(file()), HasSubstr("tensor 't': missing key 'data_offsets'")));
}

TEST_F(BadSafetensors, ExtraKey) {
  EXPECT_THAT(open_error(raw_file(
                  R"({"t": {"dtype": "U8", "shape": [0], "data_offsets": [0, 0], "x": 1}})")),
              AllOf(HasSubstr(file()), HasSubstr("tensor 't': unexpected key 'x'")));
}

TEST_F(BadSafetensors, UnknownDtype) {
  EXPECT_THAT(open_error(raw_file(
                  R"({"t": {"dtype": "F128", "shape": [1], "data_offsets": [0, 16]}})", 16)),
              AllOf(HasSubstr(file()), HasSubstr("tensor 't': unknown dtype 'F128'")));
}

TEST_F(BadSafetensors, NegativeShapeEntry) {
  EXPECT_THAT(
      open_error(raw_file(R"({"t": {"dtype": "U8", "shape": [2, -1], "data_offsets": [0, 0]}})")),
      AllOf(HasSubstr(file()), HasSubstr("tensor 't': shape[1]: -1 is negative")));
}

TEST_F(BadSafetensors, FloatShapeEntry) {
  EXPECT_THAT(
      open_error(raw_file(R"({"t": {"dtype": "U8", "shape": [2.0], "data_offsets": [0, 2]}})", 2)),
      AllOf(HasSubstr(file()),
            HasSubstr("tensor 't': shape[0]: expected a non-negative integer, got a float")));
}

TEST_F(BadSafetensors, BoolShapeEntry) {
  EXPECT_THAT(
      open_error(raw_file(R"({"t": {"dtype": "U8", "shape": [true], "data_offsets": [0, 1]}})", 1)),
      AllOf(HasSubstr(file()),
            HasSubstr("tensor 't': shape[0]: expected a non-negative integer, got a boolean")));
}

TEST_F(BadSafetensors, OffsetsBeginAfterEnd) {
  EXPECT_THAT(
      open_error(raw_file(R"({"t": {"dtype": "U8", "shape": [2], "data_offsets": [4, 2]}})", 8)),
      AllOf(HasSubstr(file()), HasSubstr("tensor 't': data_offsets begin 4 > end 2")));
}

TEST_F(BadSafetensors, OffsetsPastEndOfData) {
  EXPECT_THAT(
      open_error(raw_file(R"({"t": {"dtype": "U8", "shape": [8], "data_offsets": [0, 8]}})", 4)),
      AllOf(HasSubstr(file()),
            HasSubstr(
                "tensor 't': data_offsets end 8 is past the end of the data section (4 bytes)")));
}

TEST_F(BadSafetensors, OffsetsNotAPair) {
  EXPECT_THAT(open_error(raw_file(R"({"t": {"dtype": "U8", "shape": [0], "data_offsets": [0]}})")),
              AllOf(HasSubstr(file()),
                    HasSubstr("tensor 't': data_offsets must be an array [begin, end]")));
}

TEST_F(BadSafetensors, OverlappingOffsets) {
  const std::string h = R"({"a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]},
                            "b": {"dtype": "U8", "shape": [4], "data_offsets": [2, 6]}})";
  EXPECT_THAT(open_error(raw_file(h, 8)),
              AllOf(HasSubstr(file()), HasSubstr("tensor 'b'"), HasSubstr("overlap tensor 'a'")));
}

TEST_F(BadSafetensors, ZeroSizeTensorsNeverOverlap) {
  const std::string h = R"({"a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]},
                            "e": {"dtype": "F32", "shape": [0, 3], "data_offsets": [2, 2]}})";
  test::write_file(dir_ / "ok.safetensors", raw_file(h, 4));
  EXPECT_EQ(SafetensorsFile::open(dir_ / "ok.safetensors")->tensors().size(), 2u);
}

TEST_F(BadSafetensors, ByteSizeMismatch) {
  EXPECT_THAT(open_error(raw_file(
                  R"({"t": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 12]}})", 12)),
              AllOf(HasSubstr(file()), HasSubstr("tensor 't': dtype F32 with shape [2,3] needs 24 "
                                                 "bytes but data_offsets [0, 12] hold 12")));
}

TEST_F(BadSafetensors, ShapeProductOverflows) {
  const std::string h =
      R"({"t": {"dtype": "F32", "shape": [4294967296, 4294967296, 2], "data_offsets": [0, 0]}})";
  EXPECT_THAT(open_error(raw_file(h)),
              AllOf(HasSubstr(file()), HasSubstr("tensor 't'"), HasSubstr("more than 2^64")));
}

TEST_F(BadSafetensors, MetadataNotAStringMap) {
  EXPECT_THAT(
      open_error(raw_file(R"({"__metadata__": {"format": 1}})")),
      AllOf(HasSubstr(file()), HasSubstr("header: __metadata__ 'format' must be a string")));
  EXPECT_THAT(open_error(raw_file(R"({"__metadata__": [1]})")),
              AllOf(HasSubstr(file()), HasSubstr("__metadata__ must be an object")));
}

TEST_F(BadSafetensors, HeaderParserDirectly) {
  // parse_safetensors_header is also used on partial reads; too few bytes provided is an error.
  const std::string full = raw_file(std::string("{") + kOk + "}", 4);
  const auto* p = reinterpret_cast<const std::byte*>(full.data());
  EXPECT_THAT(error_of([&] {
                (void)parse_safetensors_header({p, 16}, full.size(), "lbl");
              }),
              HasSubstr("lbl: header: only 16 of the"));
  const auto h = parse_safetensors_header({p, full.size()}, full.size(), "lbl");
  EXPECT_EQ(h.data_begin, full.size() - 4);
  ASSERT_EQ(h.tensors.size(), 1u);
  EXPECT_EQ(h.tensors[0].shape, std::vector<int64_t>{2});
}

// ---- sharded checkpoints
// -------------------------------------------------------------------------

class BadShards : public ::testing::Test {
 protected:
  void shard(const std::string& file, const std::vector<std::string>& names) {
    test::TensorMap m;
    for (const auto& n : names) m[n] = test::filled(DType::kF16, {2});
    test::write_tensors(dir_ / file, m);
  }
  void index(const std::string& json) {
    test::write_file(dir_ / "model.safetensors.index.json", json);
  }
  std::string open_error() {
    return error_of([&] { (void)TensorStore::open(dir_.path()); });
  }
  std::string index_path() const { return (dir_ / "model.safetensors.index.json").string(); }
  test::TempDir dir_;
};

TEST_F(BadShards, IndexNamesMissingFile) {
  shard("s1.safetensors", {"a"});
  index(R"({"weight_map": {"a": "s1.safetensors", "b": "s2.safetensors"}})");
  EXPECT_THAT(open_error(), AllOf(HasSubstr(index_path()), HasSubstr("shard 's2.safetensors'"),
                                  HasSubstr("does not exist")));
}

TEST_F(BadShards, IndexNamesTensorNotInShard) {
  shard("s1.safetensors", {"a"});
  shard("s2.safetensors", {"b"});
  index(R"({"weight_map": {"a": "s1.safetensors", "b": "s1.safetensors"}})");
  EXPECT_THAT(open_error(), AllOf(HasSubstr(index_path()), HasSubstr("tensor 'b'"),
                                  HasSubstr("does not contain it")));
}

TEST_F(BadShards, DuplicateTensorAcrossShards) {
  shard("s1.safetensors", {"a", "dup"});
  shard("s2.safetensors", {"b", "dup"});
  index(R"({"weight_map": {"a": "s1.safetensors", "b": "s2.safetensors"}})");
  EXPECT_THAT(open_error(), AllOf(HasSubstr("tensor 'dup'"), HasSubstr("stored twice"),
                                  HasSubstr("s1.safetensors"), HasSubstr("s2.safetensors")));
}

TEST_F(BadShards, DuplicateTensorAcrossUnindexedFiles) {
  shard("a.safetensors", {"x"});
  shard("b.safetensors", {"x"});
  EXPECT_THAT(open_error(), AllOf(HasSubstr("tensor 'x'"), HasSubstr("stored twice")));
}

TEST_F(BadShards, IndexInvalidJson) {
  index("{\"weight_map\": ");
  EXPECT_THAT(open_error(), AllOf(HasSubstr(index_path()), HasSubstr("invalid JSON")));
}

TEST_F(BadShards, WeightMapNotAStringMap) {
  index(R"({"weight_map": {"a": 3}})");
  EXPECT_THAT(open_error(), AllOf(HasSubstr(index_path()), HasSubstr("weight_map['a']")));
  index(R"({"weight_map": []})");
  EXPECT_THAT(open_error(), AllOf(HasSubstr(index_path()), HasSubstr("must be an object")));
  index(R"({"metadata": {}})");
  EXPECT_THAT(open_error(), AllOf(HasSubstr(index_path()), HasSubstr("missing 'weight_map'")));
}

TEST_F(BadShards, ShardOutsideFolder) {
  index(R"({"weight_map": {"a": "../elsewhere.safetensors"}})");
  EXPECT_THAT(open_error(),
              AllOf(HasSubstr(index_path()), HasSubstr("inside the checkpoint folder")));
}

TEST_F(BadShards, BadShardNamesItsFile) {
  test::write_file(dir_ / "s1.safetensors", raw_file("{\"t\": 1}"));
  index(R"({"weight_map": {"t": "s1.safetensors"}})");
  EXPECT_THAT(open_error(),
              AllOf(HasSubstr((dir_ / "s1.safetensors").string()), HasSubstr("tensor 't'")));
}

}  // namespace
}  // namespace exl3
