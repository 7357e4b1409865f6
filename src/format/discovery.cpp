// discover_tensors: sorts a store's tensors into validated EXL3 linears and plain tensors.
//
// A prefix (name up to the last '.') holding `trellis` is an EXL3 linear (exllamav3's
// Linear.is_exl3_storage). Everything about it is checked here, failing closed: a half-valid
// linear would otherwise decode to garbage far from the file that caused it.
#include <algorithm>
#include <cstring>
#include <map>
#include <set>

#include <fmt/ranges.h>

#include "exl3/error.hpp"
#include "exl3/format/checkpoint.hpp"
#include "exl3/trellis/bitstream.hpp"
#include "exl3/trellis/codebook.hpp"

namespace exl3 {
namespace {

using Members = std::map<std::string, const TensorRef*>;  // suffix -> tensor

std::string shape_str(const std::vector<int64_t>& s) {
  return fmt::format("[{}]", fmt::join(s, ", "));
}

// "<file>: tensor '<name>'" — the start of every per-tensor message.
std::string where(const TensorRef& r) {
  return fmt::format("{}: tensor '{}'", r.path().string(), r.name());
}

void expect_vector(const TensorRef& r, DType dtype, int64_t length, const char* what) {
  const TensorInfo& t = *r.info;
  if (t.dtype != dtype) {
    fail("{}: dtype {}, but {} must be {}", where(r), dtype_name(t.dtype), what, dtype_name(dtype));
  }
  if (t.rank() != 1 || t.shape[0] != length) {
    fail("{}: shape {}, but {} must be [{}]", where(r), shape_str(t.shape), what, length);
  }
}

// suh/svh feed every output; a NaN or inf there poisons the whole layer.
void expect_finite_fp16(const TensorRef& r) {
  const auto v = copy_tensor<uint16_t>(r);
  for (size_t i = 0; i < v.size(); ++i) {
    if ((v[i] & 0x7C00u) == 0x7C00u) {
      const char* kind = (v[i] & 0x3FFu) != 0 ? "NaN" : ((v[i] & 0x8000u) != 0 ? "-inf" : "inf");
      fail("{}: element {} is {} (fp16 bits 0x{:04X}); scales must be finite", where(r), i, kind,
           v[i]);
    }
  }
}

trellis::Codebook check_marker(const TensorRef& r, trellis::Codebook cb, int32_t expected) {
  const TensorInfo& t = *r.info;
  if (t.dtype != DType::kI32 || t.rank() != 0) {
    fail("{}: dtype {} shape {}, but a codebook marker must be I32 with shape [] (0-dim)", where(r),
         dtype_name(t.dtype), shape_str(t.shape));
  }
  int32_t value = 0;
  std::memcpy(&value, r.bytes().data(), sizeof value);
  if (value != expected) {
    fail(
        "{}: marker holds {} (0x{:08X}), expected {} (0x{:08X}) for codebook {}; hint: made with "
        "an unlocked experimental multiplier, which today's kernels decode wrongly",
        where(r), value, static_cast<uint32_t>(value), expected, static_cast<uint32_t>(expected),
        trellis::codebook_name(cb));
  }
  return cb;
}

constexpr const char* kAllowedSuffixes[] = {"trellis", "suh", "svh",  "su",
                                            "sv",      "mcg", "mul1", "bias"};

Exl3LinearInfo validate_linear(const std::string& prefix, const Members& m) {
  const TensorRef& tr = *m.at("trellis");
  for (const auto& [suffix, ref] : m) {
    if (std::find(std::begin(kAllowedSuffixes), std::end(kAllowedSuffixes), suffix) ==
        std::end(kAllowedSuffixes)) {
      fail(
          "{}: unexpected tensor in EXL3 linear '{}' (allowed: trellis, suh, svh, su, sv, mcg, "
          "mul1, bias){}",
          where(*ref), prefix,
          suffix == "scale" ? "; hint: '.scale' is from pre-release EXL3, which exllamav3 refuses"
                            : "");
    }
  }

  // trellis: I16 [in/16, out/16, 16*K]
  const TensorInfo& t = *tr.info;
  if (t.dtype != DType::kI16)
    fail("{}: dtype {}, but a trellis must be I16", where(tr), dtype_name(t.dtype));
  if (t.rank() != 3) {
    fail("{}: rank {} (shape {}), but a trellis must be rank 3 [in/16, out/16, 16*K]", where(tr),
         t.rank(), shape_str(t.shape));
  }
  const int64_t last = t.shape[2];
  if (last % 16 != 0 ||
      !trellis::valid_bits(static_cast<int>(std::min<int64_t>(last / 16, 1000)))) {
    fail("{}: last dim {} is not 16*K for K in 1..8", where(tr), last);
  }
  if (t.shape[0] == 0 || t.shape[1] == 0)
    fail("{}: shape {} has a zero dim", where(tr), shape_str(t.shape));
  // With no zero dim, each dim is bounded by the validated byte size, so *16 cannot overflow.
  Exl3LinearInfo info;
  info.prefix = prefix;
  info.bits = static_cast<int>(last / 16);
  info.in_features = t.shape[0] * 16;
  info.out_features = t.shape[1] * 16;
  if (info.in_features % 128 != 0) {
    fail(
        "{}: in_features = shape[0]*16 = {} is not a multiple of 128; hint: EXL3 pads both dims to "
        "128",
        where(tr), info.in_features);
  }
  if (info.out_features % 128 != 0) {
    fail(
        "{}: out_features = shape[1]*16 = {} is not a multiple of 128; hint: EXL3 pads both dims "
        "to 128",
        where(tr), info.out_features);
  }

  // Rotation: fp16 suh/svh, or legacy packed-sign su/sv; exactly one spelling per side.
  const auto has = [&](const char* s) { return m.count(s) != 0; };
  for (const auto& [fp, legacy] : {std::pair{"suh", "su"}, std::pair{"svh", "sv"}}) {
    if (has(fp) && has(legacy)) {
      fail("{}: EXL3 linear '{}' has both '{}' and legacy '{}' (ambiguous)", where(*m.at(fp)),
           prefix, fp, legacy);
    }
    if (!has(fp) && !has(legacy)) {
      fail("{}: EXL3 linear '{}' has a trellis but no '{}.{}' (or legacy '{}.{}')", where(tr),
           prefix, prefix, fp, prefix, legacy);
    }
  }
  if (has("suh") != has("svh")) {
    fail("{}: EXL3 linear '{}' mixes fp16 and legacy packed-sign scales (suh/svh vs su/sv)",
         where(tr), prefix);
  }
  if (has("suh")) {
    info.rotation = Rotation::kSuhSvh;
    expect_vector(*m.at("suh"), DType::kF16, info.in_features, "suh (length in_features)");
    expect_vector(*m.at("svh"), DType::kF16, info.out_features, "svh (length out_features)");
    expect_finite_fp16(*m.at("suh"));
    expect_finite_fp16(*m.at("svh"));
  } else {
    info.rotation = Rotation::kSuSv;
    expect_vector(*m.at("su"), DType::kI16, info.in_features / 16,
                  "legacy su (length in_features/16)");
    expect_vector(*m.at("sv"), DType::kI16, info.out_features / 16,
                  "legacy sv (length out_features/16)");
  }

  if (has("mcg") && has("mul1")) {
    fail(
        "{}: EXL3 linear '{}' has both 'mcg' and 'mul1' markers; exllamav3 refuses this "
        "(\"Specified both mcg and mul1\")",
        where(tr), prefix);
  }
  if (has("mcg"))
    info.codebook = check_marker(*m.at("mcg"), trellis::Codebook::kMcg, trellis::kMcgMarker);
  if (has("mul1"))
    info.codebook = check_marker(*m.at("mul1"), trellis::Codebook::kMul1, trellis::kMul1Marker);

  if (has("bias")) {
    const TensorRef& b = *m.at("bias");
    const DType d = b.info->dtype;
    if (d != DType::kF16 && d != DType::kBF16 && d != DType::kF32) {
      fail("{}: dtype {}, but a bias must be F16, BF16 or F32", where(b), dtype_name(d));
    }
    expect_vector(b, d, info.out_features, "bias (length out_features)");
    info.has_bias = true;
  }
  for (const auto& [suffix, ref] : m) info.bytes += ref->info->nbytes();
  return info;
}

// Decimal component "0".."999999999", or -1.
int parse_index(std::string_view s) {
  if (s.empty() || s.size() > 9) return -1;
  int v = 0;
  for (const char c : s) {
    if (c < '0' || c > '9') return -1;
    v = v * 10 + (c - '0');
  }
  return v;
}

std::vector<std::string_view> split_dots(std::string_view s) {
  std::vector<std::string_view> parts;
  for (size_t start = 0;;) {
    const size_t dot = s.find('.', start);
    parts.push_back(
        s.substr(start, dot == std::string_view::npos ? std::string_view::npos : dot - start));
    if (dot == std::string_view::npos) return parts;
    start = dot + 1;
  }
}

// `...layers.{L}...experts.{E}.{proj}`: the layer is optional, the projection is what follows E.
std::optional<ExpertKey> parse_expert_key(std::string_view prefix) {
  const auto parts = split_dots(prefix);
  ExpertKey key;
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    if (key.layer < 0 && parts[i] == "layers") key.layer = parse_index(parts[i + 1]);
    if (parts[i] == "experts" && i + 2 < parts.size()) {
      key.expert = parse_index(parts[i + 1]);
      if (key.expert < 0) return std::nullopt;
      const size_t proj_begin = static_cast<size_t>(parts[i + 2].data() - prefix.data());
      key.proj = std::string(prefix.substr(proj_begin));
      return key;
    }
  }
  return std::nullopt;
}

std::string plain_role(const TensorInfo& t) {
  const std::string_view n = t.name;
  for (const auto part : split_dots(n)) {
    if (part == "embed_tokens" || part == "wte" || part == "tok_embeddings" ||
        part == "word_embeddings") {
      return "embedding";
    }
  }
  if (n.ends_with("mlp.gate.weight") || n.find("router") != std::string_view::npos ||
      n.find("e_score_correction_bias") != std::string_view::npos) {
    return "router";
  }
  if (n.find("norm") != std::string_view::npos || n.find("ln_") != std::string_view::npos)
    return "norm";
  if (n.ends_with(".weight") && t.rank() == 2) return "linear";
  if (n.ends_with(".bias")) return "bias";
  return "other";
}

std::vector<MoeLayerInfo> summarise_moe(const std::vector<Exl3LinearInfo>& linears) {
  std::map<int, std::pair<std::set<int>, std::map<int, int>>> layers;
  for (const auto& l : linears) {
    if (!l.expert) continue;
    auto& [experts, hist] = layers[l.expert->layer];
    experts.insert(l.expert->expert);
    ++hist[l.bits];
  }
  std::vector<MoeLayerInfo> out;
  for (const auto& [layer, v] : layers) {
    MoeLayerInfo info;
    info.layer = layer;
    info.num_experts = static_cast<int>(v.first.size());
    info.bits_histogram.assign(v.second.begin(), v.second.end());
    out.push_back(std::move(info));
  }
  return out;
}

}  // namespace

std::optional<SharedHRow> shared_h_row(std::string_view prefix) {
  // <head>.experts.{E}.{proj}.rank{r}
  const auto parts = split_dots(prefix);
  const size_t n = parts.size();
  if (n < 4 || parts[n - 4] != "experts" || parse_index(parts[n - 3]) < 0) return std::nullopt;
  const std::string_view proj = parts[n - 2], rank = parts[n - 1];
  if (!rank.starts_with("rank") || parse_index(rank.substr(4)) < 0) return std::nullopt;
  const char* field = nullptr;
  if (proj == "gate_proj" || proj == "up_proj") field = "suh";
  if (proj == "down_proj") field = "svh";
  if (field == nullptr) return std::nullopt;
  // Everything up to and including "experts.".
  const size_t head_len = static_cast<size_t>(parts[n - 3].data() - prefix.data());
  return SharedHRow{
      field, fmt::format("{}shared_h.{}.{}.{}", prefix.substr(0, head_len), proj, rank, field)};
}

DiscoveryResult discover_tensors(const TensorStore& store) {
  std::map<std::string, Members> groups;
  std::vector<const TensorRef*> loose;  // names without a '.'
  for (const auto& name : store.names()) {
    const TensorRef* ref = store.find(name);
    const size_t dot = name.rfind('.');
    if (dot == std::string::npos) {
      loose.push_back(ref);
    } else {
      groups[name.substr(0, dot)].emplace(name.substr(dot + 1), ref);
    }
  }

  DiscoveryResult r;
  auto add_plain = [&](const TensorRef* ref) {
    const TensorInfo& t = *ref->info;
    r.plain.push_back({t.name, t.dtype, t.shape, t.nbytes(), plain_role(t)});
  };
  for (const TensorRef* ref : loose) add_plain(ref);
  for (const auto& [prefix, members] : groups) {
    if (members.count("trellis") != 0) {
      // A shared_h_v1 expert validates against the layer's shared row; the row is stored once,
      // so its bytes are not the expert's.
      const TensorRef* borrowed = nullptr;
      Members with_row;
      if (const auto row = shared_h_row(prefix)) {
        const std::string legacy = row->field == "suh" ? "su" : "sv";
        if (members.count(row->field) == 0 && members.count(legacy) == 0) {
          borrowed = store.find(row->name);
        }
        if (borrowed != nullptr) {
          with_row = members;
          with_row.emplace(row->field, borrowed);
        }
      }
      Exl3LinearInfo info = validate_linear(prefix, borrowed != nullptr ? with_row : members);
      if (borrowed != nullptr) info.bytes -= borrowed->info->nbytes();
      info.expert = parse_expert_key(prefix);
      r.linears.push_back(std::move(info));
    } else {
      for (const auto& [suffix, ref] : members) add_plain(ref);
    }
  }
  std::sort(r.plain.begin(), r.plain.end(),
            [](const PlainTensorInfo& a, const PlainTensorInfo& b) { return a.name < b.name; });
  r.moe_layers = summarise_moe(r.linears);
  return r;
}

}  // namespace exl3
