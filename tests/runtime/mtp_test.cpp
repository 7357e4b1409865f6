// MTP drafting (exl3/runtime/mtp.hpp) on the CPU engine, over tests/model/data/deepseek_v3_mtp (a
// tiny random DeepSeek-V3 with one MTP layer; make_deepseek_v3_mtp.py): the description of the
// MTP layer; the target's kept hidden states and the head's logits against an independent float64
// reference (transformers' decoder block, the MTP equations in numpy); the head's cache after a
// round of provisional (chained) entries and a rollback equal to a fresh head fed the same
// tokens; greedy speculative output equal to plain greedy for K = 1..3, one sequence and batches
// whose acceptance differs; and the errors: a missing or misshapen tensor, a model without MTP
// layers, kAll logits, an engine without hidden states (CUDA).
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "exl3/error.hpp"
#include "exl3/format/checkpoint.hpp"
#include "exl3/format/safetensors.hpp"
#include "exl3/runtime/engine.hpp"
#include "exl3/runtime/generate.hpp"
#include "exl3/runtime/mtp.hpp"
#include "exl3/runtime/speculative.hpp"
#include "runtime_test_util.hpp"
#include "test_support.hpp"

namespace {

using namespace exl3;
using namespace exl3::runtime;
using ::testing::HasSubstr;
namespace test = exl3::runtime::test;

std::filesystem::path mtp_dir() {
  return exl3::test::model_data_dir() / "deepseek_v3_mtp";
}

struct Reference {
  std::vector<int32_t> ids;
  std::vector<double> target_logits, hidden, mtp_logits;
};

Reference reference() {
  const auto store = TensorStore::open(mtp_dir() / "mtp_reference.safetensors");
  Reference r;
  for (const int64_t id : copy_tensor<int64_t>(store.at("ids")))
    r.ids.push_back(static_cast<int32_t>(id));
  r.target_logits = read_as_double(store.at("target_logits"));
  r.hidden = read_as_double(store.at("hidden"));
  r.mtp_logits = read_as_double(store.at("mtp_logits"));
  return r;
}

template <typename T>
std::span<const T> rows(const std::vector<T>& v, int64_t first, int64_t count, int64_t width) {
  return std::span<const T>(v).subspan(static_cast<size_t>(first * width),
                                       static_cast<size_t>(count * width));
}

TEST(MtpSpec, DescribesTheLayerAndItsSharedTensors) {
  const ModelSpec s = describe_model(Checkpoint::open(mtp_dir()));
  ASSERT_EQ(s.num_layers(), 3);
  ASSERT_EQ(s.mtp_layers.size(), 1u);
  const MtpLayerSpec& m = s.mtp_layers[0];
  EXPECT_EQ(m.block.prefix, "model.layers.3");
  EXPECT_EQ(m.block.index, 3);
  EXPECT_EQ(m.block.input_norm, "model.layers.3.input_layernorm.weight");
  EXPECT_EQ(std::get<MlaAttentionSpec>(m.block.attention).prefix, "model.layers.3.self_attn");
  const auto& moe = std::get<MoeSpec>(m.block.mlp);
  EXPECT_EQ(moe.prefix, "model.layers.3.mlp");
  EXPECT_EQ(moe.shared->prefix, "model.layers.3.mlp.shared_experts");
  EXPECT_EQ(m.eh_proj, "model.layers.3.eh_proj");
  EXPECT_EQ(m.head, "model.layers.3.shared_head.head");    // its own head
  EXPECT_EQ(m.embed_tokens, "model.embed_tokens.weight");  // none of its own: the target's
  EXPECT_EQ(spec_summary(s)["mtp_layers"], 1);
  // The target is described as before: three layers, the MTP layer none of them.
  EXPECT_EQ(s.layers.back().prefix, "model.layers.2");
}

// GLM-5: the MTP layer after the four decoder layers runs its own DSA indexer (the last decoder
// layer's is shared, reading an earlier layer's selection, which the MTP layer has none of).
TEST(MtpSpec, Glm5LayerHasItsOwnIndexer) {
  const auto dir = exl3::test::model_data_dir() / "glm_moe_dsa";
  auto cfg = nlohmann::json::parse(exl3::test::read_file(dir / "config.json"));
  EXPECT_TRUE(describe_model(test::config_of(cfg), "m/config.json").mtp_layers.empty());
  cfg["num_nextn_predict_layers"] = 1;
  const ModelSpec s = describe_model(test::config_of(cfg), "m/config.json");
  ASSERT_EQ(s.mtp_layers.size(), 1u);
  const auto& block = s.mtp_layers[0].block;
  EXPECT_EQ(block.prefix, "model.layers.4");
  ASSERT_NE(s.layers.back().dsa_indexer(), nullptr);
  EXPECT_TRUE(s.layers.back().dsa_indexer()->shared);
  ASSERT_NE(block.dsa_indexer(), nullptr);
  EXPECT_FALSE(block.dsa_indexer()->shared);
  EXPECT_EQ(std::get<MlaAttentionSpec>(block.attention).prefix, "model.layers.4.self_attn");
  cfg["num_nextn_predict_layers"] = -1;
  EXPECT_THAT(exl3::test::error_of([&] { describe_model(test::config_of(cfg), "m/config.json"); }),
              HasSubstr("'num_nextn_predict_layers': expected a non-negative integer"));
}

TEST(Mtp, MatchesTheReference) {
  const Reference ref = reference();
  const auto n = static_cast<int64_t>(ref.ids.size());
  const auto ckpt = Checkpoint::open(mtp_dir());
  const auto target = load_engine(ckpt);
  const int64_t h = target->spec().hidden_size, v = target->spec().vocab_size;
  const auto head = load_mtp_draft(*target, ckpt, {});
  const auto t = target->new_sequence();
  const auto d = head->new_draft_sequence(*target, t);
  const auto logits = target->forward(t, ref.ids);
  EXPECT_LE(exl3::test::rel_l2(logits, ref.target_logits), 1e-5);
  std::vector<float> hidden;
  for (int64_t p = 0; p < n; ++p) {
    const auto row = target->hidden_state(t, p);
    ASSERT_EQ(static_cast<int64_t>(row.size()), h) << "position " << p;
    hidden.insert(hidden.end(), row.begin(), row.end());
  }
  EXPECT_LE(exl3::test::rel_l2(hidden, ref.hidden), 1e-5);

  // One token at a time: entry p (fed token p + 1) predicts token p + 2.
  const std::vector<float> none = head->forward(d, std::span(ref.ids).first(1), LogitsMode::kLast);
  EXPECT_EQ(none, std::vector<float>(static_cast<size_t>(v), 0.0f));  // one token: no entry
  std::vector<float> mtp;
  for (int64_t p = 1; p < n; ++p) {
    const auto row =
        head->forward(d, std::span(ref.ids).subspan(static_cast<size_t>(p), 1), LogitsMode::kLast);
    EXPECT_LE(exl3::test::rel_l2(row, rows(ref.mtp_logits, p - 1, 1, v)), 1e-5)
        << "entry " << p - 1;
    mtp.insert(mtp.end(), row.begin(), row.end());
  }
  const double err = exl3::test::rel_l2(mtp, ref.mtp_logits);
  std::printf("MTP logits vs the float64 reference: rel-L2 %.2e over %lld positions\n", err,
              static_cast<long long>(n - 1));
  EXPECT_LE(err, 1e-5);
  // All at once in a second pair of sequences: the last entry's logits.
  const auto t2 = target->new_sequence();
  const auto d2 = head->new_draft_sequence(*target, t2);
  target->forward(t2, ref.ids, LogitsMode::kLast);
  const auto last = head->forward(d2, ref.ids, LogitsMode::kLast);
  EXPECT_LE(exl3::test::rel_l2(last, rows(ref.mtp_logits, n - 2, 1, v)), 1e-5);
  EXPECT_EQ(head->sequence_length(d2), n);
}

// A round by hand: the head chains past what the target has scored (provisional entries), the
// target verifies, both roll back; the head's next logits equal a fresh head's over the kept
// stream, whatever was kept.
TEST(Mtp, RollbackRebuildsChainedEntries) {
  const Reference ref = reference();
  const auto ckpt = Checkpoint::open(mtp_dir());
  const auto target = load_engine(ckpt);
  const auto head = load_mtp_draft(*target, ckpt, {});
  const std::vector<int32_t> prompt(ref.ids.begin(), ref.ids.begin() + 5);
  const std::vector<int32_t> more(ref.ids.begin() + 5, ref.ids.end());  // next + 3 drafts + bonus
  for (int kept = 0; kept <= 3; ++kept) {
    const auto t = target->new_sequence();
    const auto d = head->new_draft_sequence(*target, t);
    target->forward(t, prompt, LogitsMode::kLast);
    head->forward(d, prompt, LogitsMode::kLast);
    for (int i = 0; i < 4; ++i) head->forward(d, std::span(more).subspan(i, 1), LogitsMode::kLast);
    target->forward(t, std::span(more).first(4), LogitsMode::kAll);  // next + 3 drafts
    const int64_t len = static_cast<int64_t>(prompt.size()) + 1 + kept;
    target->truncate_sequence(t, len);
    if (head->sequence_length(d) > len) head->truncate_sequence(d, len);
    std::vector<int32_t> stream = prompt;
    stream.insert(stream.end(), more.begin(), more.begin() + 1 + kept);
    stream.push_back(more[4]);  // the target's own token after the kept drafts
    // As SpeculativeDecoder does: the target lacks the last token, the head what it was not fed.
    const auto pending = std::span(stream).subspan(static_cast<size_t>(head->sequence_length(d)));
    const auto got = head->forward(d, pending, LogitsMode::kLast);

    const auto t2 = target->new_sequence();
    const auto d2 = head->new_draft_sequence(*target, t2);
    target->forward(t2, stream, LogitsMode::kLast);
    const auto want = head->forward(d2, stream, LogitsMode::kLast);
    EXPECT_LE(exl3::test::rel_l2(got, want), 1e-5) << "kept " << kept;
    for (const auto s : {d, d2}) head->drop_sequence(s);
    for (const auto s : {t, t2}) target->drop_sequence(s);
  }
}

// A model whose MTP layer mostly agrees with it: the reference checkpoint cut to its first
// (dense) layer, and an MTP layer built from that same layer (its block a copy of layer 0, unit
// enorm / hnorm, eh_proj = [I | 0.05 R] so the embedding dominates and the hidden state still
// counts, the model's final norm and head). Its entry p then runs the model's layer over the
// tokens 2 .. p + 1, which is nearly the model's own next-token pass: most drafts are kept, and how
// many differs between sequences.
void write_agreeing_model(const std::filesystem::path& dir) {
  auto cfg = nlohmann::json::parse(exl3::test::read_file(mtp_dir() / "config.json"));
  cfg["num_hidden_layers"] = 1;
  exl3::test::write_file(dir / "config.json", cfg.dump());
  const auto src = TensorStore::open(mtp_dir() / "model.safetensors");
  SafetensorsWriter w;
  const std::string l0 = "model.layers.0.";
  for (const auto& name : src.names()) {
    const bool layer0 = name.starts_with(l0);
    if (name.starts_with("model.layers.") && !layer0) continue;
    const auto f = read_as_float(src.at(name));
    w.add<float>(name, DType::kF32, src.at(name).info->shape, f);
    if (layer0) {
      w.add<float>("model.layers.1." + name.substr(l0.size()), DType::kF32,
                   src.at(name).info->shape, f);
    }
  }
  const int64_t h = cfg["hidden_size"].get<int64_t>();
  const std::vector<float> ones(static_cast<size_t>(h), 1.0f);
  w.add<float>("model.layers.1.enorm.weight", DType::kF32, {h}, ones);
  w.add<float>("model.layers.1.hnorm.weight", DType::kF32, {h}, ones);
  const auto norm = read_as_float(src.at("model.norm.weight"));
  w.add<float>("model.layers.1.shared_head.norm.weight", DType::kF32, {h}, norm);
  std::vector<float> eh(static_cast<size_t>(h * 2 * h), 0.0f);
  std::mt19937_64 rng(11);
  std::normal_distribution<float> g(0.0f, 0.05f / 8.0f);  // 0.05 / sqrt(hidden)
  for (int64_t r = 0; r < h; ++r) {
    eh[static_cast<size_t>(r * 2 * h + r)] = 1.0f;
    for (int64_t c = h; c < 2 * h; ++c) eh[static_cast<size_t>(r * 2 * h + c)] = g(rng);
  }
  w.add<float>("model.layers.1.eh_proj.weight", DType::kF32, {h, 2 * h}, eh);
  w.write(dir / "model.safetensors");
}

std::vector<std::vector<int32_t>> prompts() {
  return {{5, 42, 79, 116}, {200, 3, 3, 3, 3, 3}, {17}, {90, 91, 92, 93, 94, 95, 96, 97}};
}

// The reference model's MTP layer is random, so it rarely agrees (a few drafts kept: drafts
// rejected, rolled back); the agreeing model's mostly does (chained entries kept, rebuilt).
TEST(Mtp, GreedyEqualsPlainGreedy) {
  exl3::test::TempDir agreeing;
  write_agreeing_model(agreeing.path());
  for (const auto& dir : {mtp_dir(), agreeing.path()}) {
    const auto ckpt = Checkpoint::open(dir);
    const auto target = load_engine(ckpt);
    const auto head = load_mtp_draft(*target, ckpt, {});
    const int64_t free = head->free_cache_tokens();
    GenerateOptions go;
    go.max_new_tokens = 24;
    SpeculativeStats total;
    for (int k = 1; k <= 3; ++k) {
      for (const auto& p : prompts()) {
        const auto plain = generate(*target, p, go);
        SpeculativeStats st;
        const auto spec = generate_speculative(*target, *head, p, go, {k, false}, &st);
        EXPECT_EQ(spec.tokens, plain.tokens) << dir << " k " << k;
        EXPECT_GT(st.rounds, 0);
        total.drafted += st.drafted;
        total.accepted += st.accepted;
      }
    }
    std::printf("%s, greedy, K = 1..3: %lld of %lld drafts kept\n", dir.filename().c_str(),
                static_cast<long long>(total.accepted), static_cast<long long>(total.drafted));
    EXPECT_GT(total.accepted, 0);
    EXPECT_LT(total.accepted, total.drafted);
    if (dir != mtp_dir()) {
      EXPECT_GT(total.accepted * 4, total.drafted);  // often kept (measured: half)
    }
    EXPECT_EQ(head->free_cache_tokens(), free);  // every page came back
  }
}

TEST(Mtp, BatchedRoundsEqualPlainGreedy) {
  exl3::test::TempDir dir;
  write_agreeing_model(dir.path());
  const auto ckpt = Checkpoint::open(dir.path());
  const auto target = load_engine(ckpt);
  const auto head = load_mtp_draft(*target, ckpt, {});
  GenerateOptions go;
  go.max_new_tokens = 20;
  for (int k = 1; k <= 3; ++k) {
    SpeculativeDecoder dec(*target, *head, {k, false});
    std::vector<int> handles;
    std::vector<std::vector<int32_t>> out;
    for (const auto& p : prompts()) {
      const auto a = dec.add(p, {});
      handles.push_back(a.handle);
      out.push_back({a.first});
    }
    for (;;) {
      std::vector<SpeculativeDecoder::Slot> slots;
      std::vector<size_t> who;
      for (size_t i = 0; i < handles.size(); ++i) {
        const auto left = go.max_new_tokens - static_cast<int64_t>(out[i].size());
        if (left <= 0) continue;
        // Sequence i drafts k, except the last, which takes plain steps; capped by what is left.
        const int want =
            static_cast<int>(std::min<int64_t>(i + 1 == handles.size() ? 0 : k, left - 1));
        slots.push_back({handles[i], want});
        who.push_back(i);
      }
      if (slots.empty()) break;
      const auto r = dec.round(slots);
      for (size_t j = 0; j < r.size(); ++j)
        out[who[j]].insert(out[who[j]].end(), r[j].begin(), r[j].end());
    }
    std::vector<double> rates;
    for (size_t i = 0; i < handles.size(); ++i) {
      const auto plain = generate(*target, prompts()[i], go);
      out[i].resize(static_cast<size_t>(go.max_new_tokens));
      EXPECT_EQ(out[i], plain.tokens) << "k " << k << " sequence " << i;
      if (i + 1 < handles.size()) rates.push_back(dec.stats(handles[i]).acceptance_rate());
    }
    std::printf("k %d, acceptance of the drafting sequences:", k);
    for (const double r : rates) std::printf(" %.2f", r);
    std::printf("\n");
    EXPECT_NE(*std::ranges::min_element(rates), *std::ranges::max_element(rates)) << "k " << k;
  }
}

// An engine that says it runs on CUDA (the CPU engine underneath): what --mtp meets with
// --device cuda, whose engines hand out no hidden states.
class OnCuda final : public Engine {
 public:
  explicit OnCuda(Engine& e) : e_(e) {}
  const ModelSpec& spec() const override { return e_.spec(); }
  Device device() const override { return Device::kCuda; }
  SeqId new_sequence() override { return e_.new_sequence(); }
  void drop_sequence(SeqId seq) override { e_.drop_sequence(seq); }
  int64_t sequence_length(SeqId seq) const override { return e_.sequence_length(seq); }
  void truncate_sequence(SeqId seq, int64_t length) override { e_.truncate_sequence(seq, length); }
  KvCacheInfo kv_cache_info() const override { return e_.kv_cache_info(); }
  int64_t free_cache_tokens() const override { return e_.free_cache_tokens(); }
  int64_t cache_tokens_needed(SeqId seq, int64_t n) const override {
    return e_.cache_tokens_needed(seq, n);
  }
  std::vector<float> forward(SeqId seq, std::span<const int32_t> tokens, LogitsMode mode) override {
    return e_.forward(seq, tokens, mode);
  }

 private:
  Engine& e_;
};

TEST(Mtp, RefusesEnginesWithoutHiddenStates) {
  const auto ckpt = Checkpoint::open(mtp_dir());
  const auto cpu = load_engine(ckpt);
  OnCuda cuda(*cpu);
  EXPECT_THAT(exl3::test::error_of([&] { load_mtp_draft(cuda, ckpt, {}); }),
              HasSubstr("--mtp runs on the CPU engine only"));
  const auto seq = cuda.new_sequence();
  EXPECT_THAT(exl3::test::error_of([&] { cuda.keep_hidden_states(seq, 0); }),
              HasSubstr("the cuda engine does not hand out hidden states"));
  EXPECT_TRUE(cuda.hidden_state(seq, 0).empty());
}

// The checkpoint's files with `edit` applied to its tensors, in `dir`.
void write_edited(
    const std::filesystem::path& dir,
    const std::function<void(const std::string&, const TensorRef&, SafetensorsWriter&)>& edit) {
  const auto src = mtp_dir();
  std::filesystem::copy_file(src / "config.json", dir / "config.json");
  const auto store = TensorStore::open(src / "model.safetensors");
  SafetensorsWriter w;
  for (const auto& name : store.names()) edit(name, store.at(name), w);
  w.write(dir / "model.safetensors");
}

void keep(const std::string& name, const TensorRef& t, SafetensorsWriter& w) {
  const auto f = read_as_float(t);
  w.add<float>(name, DType::kF32, t.info->shape, f);
}

TEST(Mtp, FailsClosed) {
  {  // no eh_proj: the target loads and runs; the head names the tensor
    exl3::test::TempDir dir;
    write_edited(dir.path(), [](const std::string& name, const TensorRef& t, SafetensorsWriter& w) {
      if (name != "model.layers.3.eh_proj.weight") keep(name, t, w);
    });
    const auto ckpt = Checkpoint::open(dir.path());
    const auto target = load_engine(ckpt);
    EXPECT_EQ(forward_logits(*target, std::vector<int32_t>{1, 2, 3}).size(), 3u * 256u);
    const auto msg = exl3::test::error_of([&] { load_mtp_draft(*target, ckpt, {}); });
    EXPECT_THAT(msg, HasSubstr("model.layers.3.eh_proj"));
    EXPECT_THAT(msg, HasSubstr("missing"));
  }
  {  // eh_proj [hidden, hidden]: its input is the two halves, 2 * hidden
    exl3::test::TempDir dir;
    write_edited(dir.path(), [](const std::string& name, const TensorRef& t, SafetensorsWriter& w) {
      if (name != "model.layers.3.eh_proj.weight") return keep(name, t, w);
      const std::vector<float> square(64 * 64, 0.01f);
      w.add<float>(name, DType::kF32, {64, 64}, square);
    });
    const auto ckpt = Checkpoint::open(dir.path());
    const auto target = load_engine(ckpt);
    EXPECT_THAT(exl3::test::error_of([&] { load_mtp_draft(*target, ckpt, {}); }),
                HasSubstr("model.layers.3.eh_proj"));
  }
  {  // num_nextn_predict_layers 0: no head to load
    exl3::test::TempDir dir;
    write_edited(dir.path(), keep);
    auto cfg = nlohmann::json::parse(exl3::test::read_file(dir / "config.json"));
    cfg["num_nextn_predict_layers"] = 0;
    exl3::test::write_file(dir / "config.json", cfg.dump());
    const auto ckpt = Checkpoint::open(dir.path());
    const auto target = load_engine(ckpt);
    EXPECT_TRUE(target->spec().mtp_layers.empty());
    EXPECT_THAT(exl3::test::error_of([&] { load_mtp_draft(*target, ckpt, {}); }),
                HasSubstr("no MTP layers"));
  }
  // A checkpoint whose config names an MTP layer it does not store (transformers' default of 1):
  // the target is unaffected, the head names the first tensor it lacks.
  const auto qlora = Checkpoint::open(exl3::test::model_data_dir() / "deepseek_v3_qlora");
  const auto target = load_engine(qlora);
  EXPECT_EQ(target->spec().mtp_layers.size(), 1u);
  EXPECT_THAT(exl3::test::error_of([&] { load_mtp_draft(*target, qlora, {}); }),
              HasSubstr("model.layers.3."));
  // Only the last token's logits.
  const auto ckpt = Checkpoint::open(mtp_dir());
  const auto t2 = load_engine(ckpt);
  const auto head = load_mtp_draft(*t2, ckpt, {});
  const auto seq = t2->new_sequence();
  const auto d = head->new_draft_sequence(*t2, seq);
  const std::vector<int32_t> ids{1, 2, 3};
  t2->forward(seq, ids);
  EXPECT_THAT(exl3::test::error_of([&] { head->forward(d, ids, LogitsMode::kAll); }),
              HasSubstr("last token's logits only"));
  // A sequence that follows no target sequence cannot run.
  const auto lone = head->new_sequence();
  EXPECT_THAT(exl3::test::error_of([&] { head->forward(lone, ids, LogitsMode::kLast); }),
              HasSubstr("no target sequence"));
}

}  // namespace
