// One test per malformed EXL3 linear (and config.json): discovery must fail closed with an error
// naming the file, the tensor and the problem.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "exl3/format/checkpoint.hpp"
#include "exl3/trellis/codebook.hpp"
#include "format_test_util.hpp"
#include "test_support.hpp"

namespace exl3 {
namespace {

using test::error_of;
using test::filled;
using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr const char* kP = "model.layers.0.mlp.down_proj";
std::string n(const char* suffix) {
  return std::string(kP) + "." + suffix;
}

// A valid K=2 MUL1 linear with in = 128, out = 256, plus a norm weight.
test::TensorMap valid_linear() {
  test::TensorMap m;
  m[n("trellis")] = filled(DType::kI16, {8, 16, 32}, 0x1234);
  m[n("suh")] = filled(DType::kF16, {128}, 0x3C00);
  m[n("svh")] = filled(DType::kF16, {256}, 0xBC00);
  m[n("mul1")] = filled(DType::kI32, {}, static_cast<uint32_t>(trellis::kMul1Marker));
  m["model.norm.weight"] = filled(DType::kBF16, {128}, 0x3F80);
  return m;
}

class BadLinear : public ::testing::Test {
 protected:
  std::string discover_error(const test::TensorMap& m) {
    test::write_tensors(file_, m);
    return error_of([&] { (void)Checkpoint::open(file_); });
  }
  std::string file() const { return file_.string(); }
  // "<file>: tensor '<prefix>.<suffix>'"
  std::string at(const char* suffix) const {
    return fmt::format("{}: tensor '{}'", file(), n(suffix));
  }

  test::TempDir dir_;
  std::filesystem::path file_ = dir_ / "model.safetensors";
  test::TensorMap m_ = valid_linear();
};

TEST_F(BadLinear, ValidBaselineOpens) {
  test::write_tensors(file_, m_);
  const auto c = Checkpoint::open(file_);
  ASSERT_EQ(c.linears().size(), 1u);
  const auto& l = c.linears()[0];
  EXPECT_EQ(l.prefix, kP);
  EXPECT_EQ(l.bits, 2);
  EXPECT_EQ(l.in_features, 128);
  EXPECT_EQ(l.out_features, 256);
  EXPECT_EQ(l.codebook, trellis::Codebook::kMul1);
  EXPECT_EQ(l.bytes, 8u * 16 * 32 * 2 + 128 * 2 + 256 * 2 + 4);
  EXPECT_FALSE(l.expert.has_value());
  EXPECT_FALSE(c.config().has_value());
}

TEST_F(BadLinear, TrellisNotRank3) {
  m_[n("trellis")] = filled(DType::kI16, {8, 512});
  EXPECT_THAT(discover_error(m_),
              AllOf(HasSubstr(at("trellis")), HasSubstr("rank 2"), HasSubstr("must be rank 3")));
}

TEST_F(BadLinear, TrellisNotInt16) {
  m_[n("trellis")] = filled(DType::kF16, {8, 16, 32});
  EXPECT_THAT(discover_error(m_),
              AllOf(HasSubstr(at("trellis")), HasSubstr("dtype F16, but a trellis must be I16")));
}

TEST_F(BadLinear, LastDimNotMultipleOf16) {
  m_[n("trellis")] = filled(DType::kI16, {8, 16, 50});
  EXPECT_THAT(discover_error(m_),
              AllOf(HasSubstr(at("trellis")), HasSubstr("last dim 50 is not 16*K for K in 1..8")));
}

TEST_F(BadLinear, KIs9) {
  m_[n("trellis")] = filled(DType::kI16, {8, 16, 144});
  EXPECT_THAT(discover_error(m_),
              AllOf(HasSubstr(at("trellis")), HasSubstr("last dim 144 is not 16*K")));
}

TEST_F(BadLinear, TrellisZeroDim) {
  m_[n("trellis")] = filled(DType::kI16, {0, 16, 32});
  EXPECT_THAT(discover_error(m_), AllOf(HasSubstr(at("trellis")), HasSubstr("zero dim")));
}

TEST_F(BadLinear, InNotMultipleOf128) {
  m_[n("trellis")] = filled(DType::kI16, {4, 8, 64});
  EXPECT_THAT(discover_error(m_),
              AllOf(HasSubstr(at("trellis")),
                    HasSubstr("in_features = shape[0]*16 = 64 is not a multiple of 128")));
}

TEST_F(BadLinear, OutNotMultipleOf128) {
  m_[n("trellis")] = filled(DType::kI16, {8, 12, 32});
  EXPECT_THAT(discover_error(m_),
              AllOf(HasSubstr(at("trellis")),
                    HasSubstr("out_features = shape[1]*16 = 192 is not a multiple of 128")));
}

TEST_F(BadLinear, SuhLengthMismatch) {
  m_[n("suh")] = filled(DType::kF16, {256}, 0x3C00);
  EXPECT_THAT(discover_error(m_),
              AllOf(HasSubstr(at("suh")),
                    HasSubstr("shape [256], but suh (length in_features) must be [128]")));
}

TEST_F(BadLinear, SvhLengthMismatch) {
  m_[n("svh")] = filled(DType::kF16, {128}, 0x3C00);
  EXPECT_THAT(discover_error(m_), AllOf(HasSubstr(at("svh")), HasSubstr("must be [256]")));
}

TEST_F(BadLinear, SuhWrongDtype) {
  m_[n("suh")] = filled(DType::kF32, {128});
  EXPECT_THAT(discover_error(m_), AllOf(HasSubstr(at("suh")), HasSubstr("dtype F32, but suh")));
}

TEST_F(BadLinear, BothMcgAndMul1) {
  m_[n("mcg")] = filled(DType::kI32, {}, static_cast<uint32_t>(trellis::kMcgMarker));
  EXPECT_THAT(discover_error(m_),
              AllOf(HasSubstr(file()), HasSubstr(kP), HasSubstr("both 'mcg' and 'mul1'")));
}

TEST_F(BadLinear, MarkerValueWrong) {
  m_[n("mul1")] = filled(DType::kI32, {}, 12345);
  EXPECT_THAT(discover_error(m_), AllOf(HasSubstr(at("mul1")), HasSubstr("marker holds 12345"),
                                        HasSubstr("expected -2082680531 (0x83DCD12D)")));
}

TEST_F(BadLinear, McgMarkerValueWrong) {
  m_.erase(n("mul1"));
  m_[n("mcg")] = filled(DType::kI32, {}, static_cast<uint32_t>(trellis::kMul1Marker));
  EXPECT_THAT(discover_error(m_),
              AllOf(HasSubstr(at("mcg")), HasSubstr("expected -877912083 (0xCBAC1FED)")));
}

TEST_F(BadLinear, MarkerWrongDtype) {
  m_[n("mul1")] = filled(DType::kI64, {}, static_cast<uint32_t>(trellis::kMul1Marker));
  EXPECT_THAT(discover_error(m_), AllOf(HasSubstr(at("mul1")), HasSubstr("dtype I64 shape []"),
                                        HasSubstr("must be I32 with shape []")));
}

TEST_F(BadLinear, MarkerShapeOneIsNotZeroDim) {
  m_[n("mul1")] = filled(DType::kI32, {1}, static_cast<uint32_t>(trellis::kMul1Marker));
  EXPECT_THAT(discover_error(m_), AllOf(HasSubstr(at("mul1")), HasSubstr("shape [1]")));
}

TEST_F(BadLinear, MissingSvh) {
  m_.erase(n("svh"));
  EXPECT_THAT(discover_error(m_),
              AllOf(HasSubstr(at("trellis")), HasSubstr("no '" + n("svh") + "'")));
}

TEST_F(BadLinear, MissingSuh) {
  m_.erase(n("suh"));
  EXPECT_THAT(discover_error(m_),
              AllOf(HasSubstr(at("trellis")), HasSubstr("no '" + n("suh") + "'")));
}

TEST_F(BadLinear, BothSuhAndSu) {
  m_[n("su")] = filled(DType::kI16, {8});
  EXPECT_THAT(discover_error(m_),
              AllOf(HasSubstr(at("suh")), HasSubstr("both 'suh' and legacy 'su' (ambiguous)")));
}

TEST_F(BadLinear, MixedSuhAndSv) {
  m_.erase(n("svh"));
  m_[n("sv")] = filled(DType::kI16, {16});
  EXPECT_THAT(discover_error(m_),
              AllOf(HasSubstr(at("trellis")), HasSubstr("mixes fp16 and legacy")));
}

TEST_F(BadLinear, LegacySvLengthMismatch) {
  m_.erase(n("suh"));
  m_.erase(n("svh"));
  m_[n("su")] = filled(DType::kI16, {8});
  m_[n("sv")] = filled(DType::kI16, {8});
  EXPECT_THAT(discover_error(m_), AllOf(HasSubstr(at("sv")), HasSubstr("must be [16]")));
}

TEST_F(BadLinear, NanInSuh) {
  auto t = filled(DType::kF16, {128}, 0x3C00);
  t.data[2 * 37] = std::byte{0x01};
  t.data[2 * 37 + 1] = std::byte{0x7E};  // 0x7E01: NaN
  m_[n("suh")] = t;
  EXPECT_THAT(discover_error(m_), AllOf(HasSubstr(at("suh")), HasSubstr("element 37 is NaN")));
}

TEST_F(BadLinear, InfInSvh) {
  auto t = filled(DType::kF16, {256}, 0x3C00);
  t.data[2 * 200] = std::byte{0x00};
  t.data[2 * 200 + 1] = std::byte{0x7C};  // +inf
  m_[n("svh")] = t;
  EXPECT_THAT(discover_error(m_), AllOf(HasSubstr(at("svh")), HasSubstr("element 200 is inf")));
}

TEST_F(BadLinear, UnknownSuffixScale) {
  m_[n("scale")] = filled(DType::kF16, {1});
  EXPECT_THAT(discover_error(m_),
              AllOf(HasSubstr(at("scale")), HasSubstr("unexpected tensor in EXL3 linear"),
                    HasSubstr("exllamav3 refuses")));
}

TEST_F(BadLinear, BiasWrongLength) {
  m_[n("bias")] = filled(DType::kF32, {128});
  EXPECT_THAT(discover_error(m_), AllOf(HasSubstr(at("bias")), HasSubstr("must be [256]")));
}

TEST_F(BadLinear, BiasWrongDtype) {
  m_[n("bias")] = filled(DType::kI32, {256});
  EXPECT_THAT(
      discover_error(m_),
      AllOf(HasSubstr(at("bias")), HasSubstr("dtype I32, but a bias must be F16, BF16 or F32")));
}

TEST_F(BadLinear, BiasAcceptedAndLoaded) {
  m_[n("bias")] = filled(DType::kBF16, {256}, 0x4000);  // 2.0
  test::write_tensors(file_, m_);
  const auto c = Checkpoint::open(file_);
  EXPECT_TRUE(c.linear(kP).has_bias);
  const auto d = Exl3LinearData::load(c, kP);
  ASSERT_EQ(d.bias().size(), 256u);
  EXPECT_EQ(d.bias()[0], 2.0f);
  EXPECT_EQ(d.suh()[0], 0x3C00);
  EXPECT_EQ(d.svh()[5], 0xBC00);
  ASSERT_EQ(d.trellis().size(), 8u * 16 * 32);
  EXPECT_EQ(d.trellis()[3], 0x1234);
}

TEST_F(BadLinear, UnknownPrefixListsCloseOnes) {
  test::write_tensors(file_, m_);
  const auto c = Checkpoint::open(file_);
  EXPECT_EQ(c.find_linear("model.layers.0.mlp.up_proj"), nullptr);
  EXPECT_THAT(error_of([&] { (void)c.linear("model.layers.0.mlp.up_proj"); }),
              AllOf(HasSubstr(file()), HasSubstr("no EXL3 linear 'model.layers.0.mlp.up_proj'"),
                    HasSubstr("closest known: '" + std::string(kP) + "'")));
}

TEST(LinearData, UnalignedTrellisIsCopied) {
  // A 1-byte tensor first puts the trellis at an odd address: load must copy, not alias.
  const std::string header = R"({"pad": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]},
    "l.trellis": {"dtype": "I16", "shape": [8, 8, 16], "data_offsets": [1, 2049]},
    "l.suh": {"dtype": "F16", "shape": [128], "data_offsets": [2049, 2305]},
    "l.svh": {"dtype": "F16", "shape": [128], "data_offsets": [2305, 2561]}})";
  // Pad the header so the data section starts 8-aligned (the vector's storage is 16-aligned).
  std::string bytes = test::raw_file(header + std::string((8 - header.size() % 8) % 8, ' '), 2561);
  const size_t data = bytes.size() - 2561;
  for (size_t i = 0; i < 2048; ++i) bytes[data + 1 + i] = static_cast<char>(i * 7);
  std::vector<std::byte> buf(bytes.size());
  std::memcpy(buf.data(), bytes.data(), bytes.size());
  const auto store =
      TensorStore::from_files({SafetensorsFile::from_bytes(std::move(buf), "mem")}, "mem");
  const auto found = discover_tensors(store);
  ASSERT_EQ(found.linears.size(), 1u);
  const auto d = Exl3LinearData::load(store, found.linears[0]);
  const auto tr = d.trellis();
  ASSERT_EQ(tr.size(), 1024u);
  EXPECT_NE(reinterpret_cast<const std::byte*>(tr.data()), store.at("l.trellis").bytes().data());
  for (size_t j = 0; j < tr.size(); ++j) {
    const auto lo = static_cast<uint8_t>(2 * j * 7), hi = static_cast<uint8_t>((2 * j + 1) * 7);
    ASSERT_EQ(tr[j], lo | (hi << 8)) << j;
  }
  EXPECT_EQ(d.suh().size(), 128u);
  EXPECT_EQ(found.plain.size(), 1u);
  EXPECT_EQ(found.plain[0].role, "other");
}

TEST(LinearData, AlignedTrellisIsZeroCopy) {
  test::TempDir dir;
  test::write_tensors(dir / "m.safetensors", valid_linear());
  const auto c = Checkpoint::open(dir / "m.safetensors");
  const auto d = Exl3LinearData::load(c, kP);
  EXPECT_EQ(reinterpret_cast<const std::byte*>(d.trellis().data()),
            c.store().at(n("trellis")).bytes().data());
}

// ---- config.json
// ---------------------------------------------------------------------------------

class BadConfig : public ::testing::Test {
 protected:
  std::string open_error(const std::string& config) {
    test::write_tensors(dir_ / "model.safetensors", valid_linear());
    test::write_file(dir_ / "config.json", config);
    return error_of([&] { (void)Checkpoint::open(dir_.path()); });
  }
  std::string cfg() const { return (dir_ / "config.json").string(); }
  test::TempDir dir_;
};

TEST_F(BadConfig, InvalidJson) {
  EXPECT_THAT(open_error("{\"hidden_size\": 12"),
              AllOf(HasSubstr(cfg()), HasSubstr("invalid JSON")));
}

TEST_F(BadConfig, WrongTypeNamesKey) {
  EXPECT_THAT(open_error(R"({"hidden_size": "256"})"),
              AllOf(HasSubstr(cfg()), HasSubstr("key 'hidden_size'")));
  EXPECT_THAT(open_error(R"({"num_hidden_layers": 2.5})"),
              AllOf(HasSubstr(cfg()), HasSubstr("key 'num_hidden_layers'")));
  EXPECT_THAT(open_error(R"({"vocab_size": -1})"),
              AllOf(HasSubstr(cfg()), HasSubstr("key 'vocab_size'")));
  EXPECT_THAT(open_error(R"({"architectures": "Llama"})"),
              AllOf(HasSubstr(cfg()), HasSubstr("key 'architectures'")));
  EXPECT_THAT(open_error(R"({"tie_word_embeddings": 1})"),
              AllOf(HasSubstr(cfg()), HasSubstr("key 'tie_word_embeddings'")));
  EXPECT_THAT(open_error(R"([])"), AllOf(HasSubstr(cfg()), HasSubstr("must be a JSON object")));
}

TEST_F(BadConfig, QuantizationConfigFileInvalid) {
  test::write_tensors(dir_ / "model.safetensors", valid_linear());
  test::write_file(dir_ / "quantization_config.json", "{");
  EXPECT_THAT(
      error_of([&] { (void)Checkpoint::open(dir_.path()); }),
      AllOf(HasSubstr((dir_ / "quantization_config.json").string()), HasSubstr("invalid JSON")));
}

TEST(ModelConfig, ExpertCountSpellingsAndNulls) {
  auto c = parse_model_config(R"({"n_routed_experts": 64, "head_dim": null, "rms_norm_eps": 1e-5,
                                  "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
                                  "n_shared_experts": 1, "tie_word_embeddings": true})",
                              "c.json");
  EXPECT_EQ(c.num_experts, 64);
  EXPECT_EQ(c.head_dim, 0);
  EXPECT_EQ(c.n_shared_experts, 1);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.architecture, "DeepseekV3ForCausalLM");
  EXPECT_TRUE(c.quantization_config.is_null());
  c = parse_model_config(R"({"num_local_experts": 8})", "c.json");
  EXPECT_EQ(c.num_experts, 8);
  EXPECT_TRUE(c.raw.is_object());
}

}  // namespace
}  // namespace exl3
