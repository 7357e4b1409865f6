// The exl3-v1 manifest and extent planner: the Kimi geometry's tables (docs/moe-layouts.md, exl3-v1
// slot containers: local widths at layer 1 for TP 2..24, per-rank totals over 92 layers at TP 10),
// the planner's invariants for every TP in 2..24, strict schema rejection (unknown keys, types,
// ranges), and the layer files' sha256 and metadata checks.
#include <set>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "exl3/error.hpp"
#include "exl3/format/exl3_manifest.hpp"
#include "exl3/format/safetensors.hpp"
#include "test_support.hpp"

namespace exl3 {
namespace {

using ::testing::HasSubstr;
using nlohmann::json;

// The Kimi container (docs/moe-layouts.md): 96 slots x 32 = 3072, barrier 48, alignment 4,
// layers 1..92.
json kimi_manifest() {
  json layers = json::object();
  std::vector<int> idx;
  for (int l = 1; l <= 92; ++l) {
    idx.push_back(l);
    layers[std::to_string(l)] = {{"file", fmt::format("exl3-layer-{:05d}.safetensors", l)},
                                 {"sha256", std::string(64, 'a')}};
  }
  return {{"kind", "exl3-manifest"},
          {"schema", "exl3-v1"},
          {"codebook", "mcg"},
          {"codebook_seed", 3417055213u},
          {"geometry",
           {{"num_experts", 384}, {"hidden_size", 7168}, {"intermediate_size", 3072}, {"slot_channels", 32},
            {"num_slots", 96}, {"moe_layer_indices", idx}}},
          {"rates", {{"structure", "uniform"}, {"bits", 3}}},
          {"hadamard", {{"intermediate_hadamard", false}, {"pre_block", 128}, {"post_block", 128},
                        {"per_expert_input_rotations", true}}},
          {"layout", {{"row_alignment", 256}, {"extent_alignment_slots", 4}, {"extent_barriers", {48}}}},
          {"layers", layers}};
}

Exl3Manifest parse(const json& j) {
  return parse_exl3_manifest(j.dump(), "m/exl3-manifest.json");
}

std::vector<int64_t> widths(const Exl3Manifest& m, int layer, int tp) {
  std::vector<int64_t> out;
  for (int r = 0; r < tp; ++r) out.push_back(plan_exl3_extent(m, layer, tp, r).channels());
  return out;
}

std::multiset<int64_t> as_set(const std::vector<int64_t>& v) {
  return {v.begin(), v.end()};
}

TEST(Exl3Manifest, KimiLocalWidthsAtLayer1) {
  const auto m = parse(kimi_manifest());
  EXPECT_EQ(m.geometry.num_slots, 96);
  EXPECT_EQ(m.layers.size(), 92u);
  EXPECT_EQ(widths(m, 1, 2), (std::vector<int64_t>{1536, 1536}));
  EXPECT_EQ(as_set(widths(m, 1, 3)), (std::multiset<int64_t>{768, 768, 1536}));  // unequal at one layer
  EXPECT_EQ(widths(m, 1, 4), std::vector<int64_t>(4, 768));
  EXPECT_EQ(widths(m, 1, 8), std::vector<int64_t>(8, 384));
  for (const int tp : {9, 10}) {
    for (const auto w : widths(m, 1, tp)) EXPECT_TRUE(w == 384 || w == 256) << "TP " << tp << ": " << w;
  }
  EXPECT_EQ(widths(m, 1, 12), std::vector<int64_t>(12, 256));
  for (const auto w : widths(m, 1, 16)) EXPECT_TRUE(w == 256 || w == 128) << w;
  EXPECT_EQ(widths(m, 1, 24), std::vector<int64_t>(24, 128));
  // Ownership rotates: at TP 3 the rank with the wide second half changes every layer.
  EXPECT_EQ(plan_exl3_extent(m, 1, 3, 0), (Exl3Extent{48, 48, 32}));
  EXPECT_EQ(plan_exl3_extent(m, 2, 3, 1), (Exl3Extent{48, 48, 32}));
  EXPECT_EQ(plan_exl3_extent(m, 3, 3, 2), (Exl3Extent{48, 48, 32}));
}

TEST(Exl3Manifest, Tp10TotalsOver92Layers) {
  const auto m = parse(kimi_manifest());
  for (int r = 0; r < 10; ++r) {
    int64_t total = 0;
    for (int l = 1; l <= 92; ++l) total += plan_exl3_extent(m, l, 10, r).slot_count;
    EXPECT_TRUE(total == 880 || total == 884) << "rank " << r << ": " << total;
  }
}

// Every TP 2..24 and layer: the ranks' extents partition the slots, each inside one half, whole
// 128-channel blocks, no rank more than one block above another within a half.
TEST(Exl3Manifest, ExtentsPartitionTheSlotsForEveryTp) {
  const auto m = parse(kimi_manifest());
  for (int tp = 2; tp <= 24; ++tp) {
    for (const int l : {1, 2, 7, 46, 92}) {
      std::vector<int> owner(96, -1);
      for (int r = 0; r < tp; ++r) {
        const auto e = plan_exl3_extent(m, l, tp, r);
        EXPECT_EQ(e.first_slot % 4, 0);
        EXPECT_EQ(e.slot_count % 4, 0);
        EXPECT_TRUE(e.first_slot + e.slot_count <= 48 || e.first_slot >= 48) << "crosses the barrier";
        for (int64_t s = e.first_slot; s < e.first_slot + e.slot_count; ++s) {
          EXPECT_EQ(owner[static_cast<size_t>(s)], -1) << "slot " << s << " twice at TP " << tp;
          owner[static_cast<size_t>(s)] = r;
        }
      }
      EXPECT_EQ(std::count(owner.begin(), owner.end(), -1), 0) << "TP " << tp << " layer " << l;
    }
  }
}

TEST(Exl3Manifest, PlannerFailsClosed) {
  auto j = kimi_manifest();
  const auto m = parse(j);
  EXPECT_THAT([&] { plan_exl3_extent(m, 1, 1, 0); }, ::testing::ThrowsMessage<Error>(HasSubstr("TP 2..24, not 1")));
  EXPECT_THAT([&] { plan_exl3_extent(m, 1, 25, 0); }, ::testing::ThrowsMessage<Error>(HasSubstr("not 25")));
  EXPECT_THAT([&] { plan_exl3_extent(m, 0, 4, 0); }, ::testing::ThrowsMessage<Error>(HasSubstr("layer 0 is not an MoE layer")));
  EXPECT_THAT([&] { plan_exl3_extent(m, 1, 4, 4); }, ::testing::ThrowsMessage<Error>(HasSubstr("rank 4 is outside 0..3")));
  for (const json& barriers : {json::array(), json{40}, json{24, 72}}) {
    j["layout"]["extent_barriers"] = barriers;
    const auto bad = parse(j);
    EXPECT_THAT([&] { plan_exl3_extent(bad, 1, 4, 0); },
                ::testing::ThrowsMessage<Error>(HasSubstr("requires one barrier between aligned halves")));
  }
  j = kimi_manifest();
  j["layout"]["extent_alignment_slots"] = 5;  // 48 slots per half are not whole blocks of 5
  EXPECT_THAT([&] { plan_exl3_extent(parse(j), 1, 4, 0); },
              ::testing::ThrowsMessage<Error>(HasSubstr("requires one barrier between aligned halves")));
}

struct BadCase {
  const char* name;
  json patch;  // JSON merge patch (null deletes a key)
  const char* message;
};

TEST(Exl3Manifest, SchemaIsStrict) {
  const BadCase cases[] = {
      {"unknown top key", {{"extra", 1}}, "unknown key 'extra'"},
      {"unknown nested key", {{"geometry", {{"num_layers", 3}}}}, "unknown key 'geometry.num_layers'"},
      {"unknown layer key", {{"layers", {{"1", {{"size", 3}}}}}}, "unknown key 'layers.1.size'"},
      {"missing key", {{"rates", nullptr}}, "required key 'rates' is missing"},
      {"kind", {{"kind", "manifest"}}, "'kind' is 'manifest'"},
      {"schema", {{"schema", "exl3-v2"}}, "understands 'exl3-v1' only"},
      {"codebook", {{"codebook", "sqg_e4m3"}}, "expected mcg, lut_e4m3 or lut_fp16"},
      {"seed value", {{"codebook_seed", 1}}, "MCG codebook's multiplier"},
      {"seed missing", {{"codebook_seed", nullptr}}, "required key 'codebook_seed'"},
      {"seed on lut", {{"codebook", "lut_fp16"}}, "only mcg takes a seed"},
      {"slot channels", {{"geometry", {{"slot_channels", 64}, {"num_slots", 48}}}}, "slots are 32 channels"},
      {"num slots", {{"geometry", {{"num_slots", 95}}}}, "intermediate_size 3072 / slot_channels 32"},
      {"bool as int", {{"geometry", {{"num_experts", true}}}}, "must be an integer"},
      {"float as int", {{"geometry", {{"hidden_size", 7168.0}}}}, "must be an integer"},
      {"hidden not 128", {{"geometry", {{"hidden_size", 7000}}}}, "not a multiple of 128"},
      {"layers unordered", {{"geometry", {{"moe_layer_indices", {2, 1}}}}}, "ascending and distinct"},
      {"uniform bits", {{"rates", {{"bits", 7}}}}, "outside 2..6"},
      {"rate structure", {{"rates", {{"structure", "mixed"}}}}, "expected uniform or per_expert_pair"},
      {"pair kinds", {{"rates", {{"structure", "per_expert_pair"}, {"bits", nullptr}, {"pair_kinds", {"P22", "P55"}}}}},
       "pair kinds are P22"},
      {"uniform with pair kinds", {{"rates", {{"pair_kinds", {"P22"}}}}}, "unknown key 'rates.pair_kinds'"},
      {"hadamard block", {{"hadamard", {{"pre_block", 100}}}}, "power of two"},
      {"hadamard bool", {{"hadamard", {{"intermediate_hadamard", 1}}}}, "must be true or false"},
      {"barrier range", {{"layout", {{"extent_barriers", {96}}}}}, "outside 1..95"},
      {"layer not listed", {{"layers", {{"93", {{"file", "x.safetensors"}, {"sha256", std::string(64, 'b')}}}}}},
       "not listed in geometry.moe_layer_indices"},
      {"layer missing", {{"layers", {{"5", nullptr}}}}, "no entry for MoE layer 5"},
      {"layer key", {{"layers", {{"01", {{"file", "y.safetensors"}, {"sha256", std::string(64, 'b')}}}}}},
       "not a decimal layer index"},
      {"sha format", {{"layers", {{"1", {{"sha256", std::string(64, 'A')}}}}}}, "64 lowercase hex"},
      {"file path", {{"layers", {{"1", {{"file", "../x.safetensors"}}}}}}, "bare '*.safetensors' name"},
      {"file reused", {{"layers", {{"2", {{"file", "exl3-layer-00001.safetensors"}}}}}}, "used by two layers"},
  };
  for (const auto& c : cases) {
    auto j = kimi_manifest();
    j.merge_patch(c.patch);
    EXPECT_THAT([&] { parse(j); }, ::testing::ThrowsMessage<Error>(HasSubstr(c.message))) << c.name;
  }
  EXPECT_THAT([&] { parse_exl3_manifest("{", "m.json"); }, ::testing::ThrowsMessage<Error>(HasSubstr("not valid JSON")));
  auto ok = kimi_manifest();
  ok["rates"] = {{"structure", "per_expert_pair"}, {"pair_kinds", {"P22", "P43"}}};
  EXPECT_EQ(parse(ok).rates.pair_kinds, (std::vector<std::string>{"P22", "P43"}));
}

TEST(Exl3Manifest, Sha256MatchesTheStandardVectors) {
  // FIPS 180-2 examples.
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  exl3::test::TempDir tmp;
  std::string big(3 << 20, 'a');  // spans several read chunks
  exl3::test::write_file(tmp / "big", big);
  EXPECT_EQ(sha256_file_hex(tmp / "big"), sha256_hex(big));
}

// A small container on disk: the layer files' digests and metadata are checked.
TEST(Exl3Manifest, ReadChecksLayerFiles) {
  exl3::test::TempDir tmp;
  auto rng = exl3::test::make_rng();
  json j = kimi_manifest();
  j["geometry"]["moe_layer_indices"] = {3, 4};
  j["layers"] = json::object();
  const auto geometry = [&] {
    auto g = j;
    g["layers"] = {{"3", {{"file", "a.safetensors"}, {"sha256", std::string(64, 'a')}}},
                   {"4", {{"file", "b.safetensors"}, {"sha256", std::string(64, 'a')}}}};
    return parse(g).geometry_json();
  }();
  auto write_layer = [&](int layer, const std::string& file, const std::string& geom) {
    SafetensorsWriter w;
    std::vector<uint8_t> codes(64);
    for (auto& c : codes) c = static_cast<uint8_t>(rng());
    w.add("codes", DType::kU8, {8, 8}, std::span<const uint8_t>(codes));
    w.set_metadata("schema", "exl3-v1");
    w.set_metadata("codebook", "mcg");
    w.set_metadata("layer", std::to_string(layer));
    w.set_metadata("geometry", geom);
    w.write(tmp / file);
    j["layers"][std::to_string(layer)] = {{"file", file}, {"sha256", sha256_file_hex(tmp / file)}};
  };
  write_layer(3, "a.safetensors", geometry);
  write_layer(4, "b.safetensors", geometry);
  write_file_atomic(tmp.path() / "exl3-manifest.json", j.dump());
  const auto m = read_exl3_manifest(tmp.path());
  EXPECT_EQ(m.layers.at(4).file, "b.safetensors");
  EXPECT_EQ(plan_exl3_extent(m, 4, 2, 0).channels(), 1536);

  // One flipped byte: the digest no longer matches.
  auto bytes = exl3::test::read_file(tmp / "b.safetensors");
  bytes.back() = static_cast<char>(bytes.back() ^ 1);
  exl3::test::write_file(tmp / "b.safetensors", bytes);
  EXPECT_THAT([&] { read_exl3_manifest(tmp.path()); },
              ::testing::ThrowsMessage<Error>(AllOf(HasSubstr("b.safetensors: sha256"), HasSubstr("layer 4"))));
  // Metadata that does not echo the manifest (right digest, wrong layer).
  write_layer(4, "b.safetensors", geometry);
  write_layer(3, "a.safetensors", "{}");
  write_file_atomic(tmp.path() / "exl3-manifest.json", j.dump());
  EXPECT_THAT([&] { read_exl3_manifest(tmp.path()); },
              ::testing::ThrowsMessage<Error>(HasSubstr("metadata 'geometry' is '{}'")));
  std::filesystem::remove(tmp / "a.safetensors");
  EXPECT_THAT([&] { read_exl3_manifest(tmp.path()); }, ::testing::ThrowsMessage<Error>(HasSubstr("is missing")));
}

}  // namespace
}  // namespace exl3
