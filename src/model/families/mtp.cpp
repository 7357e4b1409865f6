// The MTP layers of DeepSeek-V3 / V3.2 and GLM-5 (num_nextn_predict_layers; see MtpLayerSpec):
// each is a decoder block like the model's last layer, stored after the decoder layers, with
// its own input norms and projection in front and a head behind.
#include <fmt/format.h>

#include "exl3/error.hpp"
#include "model/families/family.hpp"

namespace exl3::model::families {
namespace {

// `name` with its leading `from` (a layer prefix) replaced by `to`; empty names stay empty.
std::string rebase(const std::string& name, const std::string& from, const std::string& to) {
  if (name.empty()) return name;
  if (name.compare(0, from.size(), from) != 0) {
    fail("MTP layer: tensor '{}' is not under '{}'", name, from);  // a family naming bug
  }
  return to + name.substr(from.size());
}

LayerSpec renamed(const LayerSpec& last, int index) {
  LayerSpec l = last;
  const std::string to = fmt::format("model.layers.{}", index);
  const auto re = [&](std::string& s) { s = rebase(s, last.prefix, to); };
  l.index = index;
  re(l.input_norm);
  re(l.post_attention_norm);
  re(l.attention_output_norm);
  re(l.mlp_output_norm);
  std::visit([&](auto& a) { re(a.prefix); }, l.attention);
  if (auto* mla = std::get_if<MlaAttentionSpec>(&l.attention); mla != nullptr && mla->indexer) {
    mla->indexer->shared = false;  // the MTP layer runs on its own: it selects its positions
  }
  if (auto* d = std::get_if<DenseMlpSpec>(&l.mlp)) {
    re(d->prefix);
  } else {
    auto& m = std::get<MoeSpec>(l.mlp);
    re(m.prefix);
    if (m.shared) re(m.shared->prefix);
  }
  l.prefix = to;
  return l;
}

}  // namespace

void describe_mtp(Family& f) {
  const int64_t n = f.keys.integer("num_nextn_predict_layers", 0);  // refuses negative counts
  if (n == 0 || f.spec.layers.empty()) return;
  for (int64_t i = 0; i < n; ++i) {
    MtpLayerSpec m;
    m.block = renamed(f.spec.layers.back(), static_cast<int>(f.num_layers + i));
    const std::string& p = m.block.prefix;
    m.enorm = p + ".enorm.weight";
    m.hnorm = p + ".hnorm.weight";
    m.eh_proj = p + ".eh_proj";
    m.head_norm = p + ".shared_head.norm.weight";
    m.head = p + ".shared_head.head";
    m.embed_tokens = p + ".embed_tokens.weight";
    f.spec.mtp_layers.push_back(std::move(m));
  }
}

}  // namespace exl3::model::families
