// The CPU reference forward pass against goldens computed by transformers
// (float32, from the same stored bf16 weights) on the tiny qwen3_5_moe
// checkpoints, in both naming layouts.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "cpu_backend.h"
#include "engine/engine.h"
#include "engine/generate.h"
#include "model/weights.h"
#include "engine_util.h"
#include "test_util.h"

using namespace coli;

namespace {

const nlohmann::json& goldens() { return test::tiny_goldens(); }

// Logits of the tiny model reach about 25 in magnitude, so an absolute 1e-3
// is a relative error of 4e-5; float32 reordering gives ~1e-5 absolute.
constexpr float kLogitTol = 1e-3f;

float max_abs_diff(const std::vector<float>& a, const nlohmann::json& b) {
  EXPECT_EQ(a.size(), b.size());
  float m = 0;
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i].get<float>()));
  return m;
}

class Fixture : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    model_ = Model::load(test::data_dir() + "/" + GetParam());
    backend_ = std::make_unique<cpu::CpuBackend>(*model_);
    engine_ = std::make_unique<Engine>(model_->spec(), *backend_);
  }
  std::unique_ptr<Model> model_;
  std::unique_ptr<cpu::CpuBackend> backend_;
  std::unique_ptr<Engine> engine_;
};

}  // namespace

TEST_P(Fixture, ExpertLayoutIsTheOneStored) {
  // The text fixture stores per-expert tensors, the multimodal one fused 3-D tensors.
  EXPECT_EQ(model_->layer(0).moe.fused_layout, GetParam() == "tiny-qwen35moe-vl");
}

TEST_P(Fixture, PromptLogitsAndRouterMatchTransformers) {
  for (const auto& p : goldens()["prompts"]) {
    const std::vector<int> ids = p["ids"];
    Session s = engine_->new_session();
    std::vector<std::vector<std::vector<int>>> topk(model_->spec().num_layers);
    const int K = model_->spec().num_experts_per_tok;
    auto logits = engine_->forward(s, ids, [&](int layer, int T, const int* idx, const float*) {
      for (int t = 0; t < T; ++t) topk[layer].emplace_back(idx + t * K, idx + (t + 1) * K);
    });
    const float err = max_abs_diff(logits, p["last_logits"]);
    EXPECT_LT(err, kLogitTol) << "prompt of " << ids.size() << " tokens";
    std::printf("[ info     ] %s, %zu-token prompt: max |logit - golden| = %.3g\n", GetParam().c_str(), ids.size(), err);
    for (int l = 0; l < model_->spec().num_layers; ++l)
      EXPECT_EQ(topk[l], p["router_topk"][l].get<std::vector<std::vector<int>>>()) << "layer " << l << ", prompt of " << ids.size();
  }
}

TEST_P(Fixture, HiddenStatesAfterEmbeddingMatch) {
  // hidden_states[0] of transformers is the embedding: checks the row lookup and dtype path.
  const auto& p = goldens()["prompts"][1];
  const std::vector<int> ids = p["ids"];
  const int H = model_->spec().hidden_size;
  std::vector<float> x(ids.size() * H);
  backend_->embed(ids.data(), static_cast<int>(ids.size()), x.data());
  for (std::size_t t = 0; t < ids.size(); ++t)
    for (int i = 0; i < H; ++i) ASSERT_EQ(x[t * H + i], p["hidden_states"][0][t][i].get<float>());
}

TEST_P(Fixture, GreedyTokensMatchTransformers) {
  for (const auto& p : goldens()["prompts"]) {
    const std::vector<int> ids = p["ids"];
    Session s = engine_->new_session();
    GenerateOptions opt;
    opt.n_predict = 16;
    opt.ignore_eos = true;
    opt.sampling.temperature = 0;  // greedy
    std::vector<int> got;
    generate(*engine_, s, ids, opt, [&](const TokenEvent& ev) { got.push_back(ev.id); });
    EXPECT_EQ(got, p["greedy"].get<std::vector<int>>()) << "prompt of " << ids.size() << " tokens";
  }
}

TEST_P(Fixture, DecodeStepLogitsMatchTransformers) {
  const auto& p = goldens()["prompts"][1];
  const std::vector<int> ids = p["ids"];
  const std::vector<int> greedy = p["greedy"];
  Session s = engine_->new_session();
  auto logits = engine_->forward(s, ids);
  float worst = 0;
  for (std::size_t i = 0; i < greedy.size(); ++i) {
    worst = std::max(worst, max_abs_diff(logits, p["step_logits"][i]));
    logits = engine_->forward(s, std::vector<int>{greedy[i]});
  }
  EXPECT_LT(worst, kLogitTol);
}

TEST_P(Fixture, PrefillThenDecodeEqualsAllAtOnce) {
  const std::vector<int> ids = goldens()["prompts"][2]["ids"];
  Session all = engine_->new_session();
  auto l_all = engine_->forward(all, ids);
  // Token by token.
  Session one = engine_->new_session();
  std::vector<float> l_one;
  for (int id : ids) l_one = engine_->forward(one, std::vector<int>{id});
  // Split prefill: 25 tokens, then chunks of 7 via a small prefill chunk.
  Engine chunky(model_->spec(), *backend_, 7);
  Session split = chunky.new_session();
  chunky.forward(split, std::span<const int>(ids.data(), 25));
  auto l_split = chunky.forward(split, std::span<const int>(ids.data() + 25, ids.size() - 25));
  ASSERT_EQ(l_all.size(), l_one.size());
  for (std::size_t i = 0; i < l_all.size(); ++i) {
    ASSERT_NEAR(l_all[i], l_one[i], 1e-5f) << "logit " << i;
    ASSERT_NEAR(l_all[i], l_split[i], 1e-5f) << "logit " << i;
  }
}

// One decode step of several sessions at once (Engine::forward_rows, the
// server's parallel slots): three sessions at different depths step
// together for 8 steps, each row's logits those of its session stepped
// alone: bit for bit on the scalar reference (each row's arithmetic is the
// same), within float rounding on the fast backend (S-row kernels), with
// the same greedy tokens; the states advance as alone. Every other step
// through forward_rows_view.
TEST_P(Fixture, ForwardRowsMatchesEachSessionAlone) {
  cpu::CpuOptions fast_opt;
  fast_opt.threads = 2, fast_opt.fast = true;
  cpu::CpuBackend fast(*model_, fast_opt);
  Engine fast_engine(model_->spec(), fast);
  for (Engine* e : {engine_.get(), &fast_engine}) {
    const bool ref = e == engine_.get();
    SCOPED_TRACE(ref ? "reference" : "fast");
    const int V = model_->spec().vocab_size;
    std::vector<Session> batch, solo;
    std::vector<int> next;
    for (int p = 0; p < 3; ++p) {
      const std::vector<int> ids = goldens()["prompts"][p]["ids"];
      batch.push_back(e->new_session()), solo.push_back(e->new_session());
      const std::vector<float> a = e->forward(batch.back(), ids), b = e->forward(solo.back(), ids);
      next.push_back(static_cast<int>(std::max_element(a.begin(), a.end()) - a.begin()));
      ASSERT_EQ(a, b);
    }
    for (int step = 0; step < 8; ++step) {
      std::vector<Session*> rows = {&batch[0], &batch[1], &batch[2]};
      std::vector<float> l;
      if (step % 2) {  // the view: a CPU backend keeps no host copy, so the rows are in the caller's buffer
        std::vector<float> buf;
        const std::span<const float> v = e->forward_rows_view(rows, next, buf);
        EXPECT_EQ(v.data(), buf.data()) << "step " << step;
        l.assign(v.begin(), v.end());
      } else {
        l = e->forward_rows(rows, next);
      }
      ASSERT_EQ(l.size(), 3u * V);
      for (int i = 0; i < 3; ++i) {
        const std::vector<float> alone = e->forward(solo[i], std::vector<int>{next[i]});
        const std::vector<float> row(l.begin() + static_cast<std::ptrdiff_t>(i) * V, l.begin() + static_cast<std::ptrdiff_t>(i + 1) * V);
        if (ref) {
          ASSERT_EQ(row, alone) << "step " << step << " row " << i;
        } else {
          float m = 0;
          for (int v = 0; v < V; ++v) m = std::max(m, std::fabs(row[v] - alone[v]));
          ASSERT_LT(m, 1e-3f) << "step " << step << " row " << i;
        }
        const int a = static_cast<int>(std::max_element(row.begin(), row.end()) - row.begin());
        ASSERT_EQ(a, static_cast<int>(std::max_element(alone.begin(), alone.end()) - alone.begin())) << "step " << step << " row " << i;
        next[i] = a;
        EXPECT_EQ(batch[i].n_past, solo[i].n_past);
      }
    }
  }
  Session a = engine_->new_session();
  std::vector<Session*> twice = {&a, &a};
  EXPECT_THROW(engine_->forward_rows(twice, std::vector<int>{1, 2}), Error);
  std::vector<Session*> one = {&a};
  EXPECT_THROW(engine_->forward_rows(one, std::vector<int>{model_->spec().vocab_size}), Error);
  EXPECT_THROW(engine_->forward_rows(one, std::vector<int>{1, 2}), Error);
  // Greedy ids found where the logits are: the CPU backend's are on the
  // host already, so it declines and nothing is stepped; bad rows throw first.
  Session b = engine_->new_session();
  engine_->forward(b, std::vector<int>{3});
  std::vector<Session*> ab = {&a, &b};
  std::vector<int> got;
  EXPECT_FALSE(engine_->forward_rows_greedy(ab, std::vector<int>{4, 5}, got));
  EXPECT_EQ(a.n_past, 0);
  EXPECT_EQ(b.n_past, 1);
  EXPECT_THROW(engine_->forward_rows_greedy(twice, std::vector<int>{1, 2}, got), Error);
}

// Decode rows and prompt chunks of several sessions in one pass
// (Engine::forward_segments, coli-serve's mixed steps): four sessions, two
// decoding, one reading its prompt in pieces, one taking a continuation,
// step together in three shapes (rows first, a row after a chunk, a chunk
// first); each segment's row is the logits of its session fed the same ids
// alone: bit for bit on the scalar reference, within float rounding on the
// fast backend (many-row kernels), with the same greedy tokens.
TEST_P(Fixture, ForwardSegmentsMatchesEachSessionAlone) {
  cpu::CpuOptions fast_opt;
  fast_opt.threads = 2, fast_opt.fast = true;
  cpu::CpuBackend fast(*model_, fast_opt);
  Engine fast_engine(model_->spec(), fast);
  const int V = model_->spec().vocab_size;
  const std::vector<int> p0 = goldens()["prompts"][0]["ids"], p1 = goldens()["prompts"][1]["ids"], p2 = goldens()["prompts"][2]["ids"];
  ASSERT_GE(p2.size(), 20u);
  for (Engine* e : {engine_.get(), &fast_engine}) {
    const bool ref = e == engine_.get();
    SCOPED_TRACE(ref ? "reference" : "fast");
    std::vector<Session> batch, solo;
    for (int i = 0; i < 4; ++i) batch.push_back(e->new_session()), solo.push_back(e->new_session());
    std::vector<int> next(4, 0);
    for (Session* s : {&batch[0], &solo[0]}) e->forward(*s, p0);
    for (Session* s : {&batch[1], &solo[1]}) e->forward(*s, p1);
    for (Session* s : {&batch[3], &solo[3]}) e->forward(*s, std::span<const int>(p2.data(), 5));
    next[0] = 11, next[1] = 12;
    std::size_t at2 = 0, at3 = 5;  // where sessions 2 and 3 are in p2
    // Segment shapes: session, ids (decode rows take next[i], the others the prompt's next ids).
    struct Shape {
      std::vector<int> order, lens;
    };
    const std::vector<Shape> shapes = {{{0, 1, 2, 3}, {1, 1, 7, 6}}, {{2, 0, 3}, {9, 1, 3}}, {{3, 2, 1, 0}, {1, 4, 1, 1}}};
    for (std::size_t k = 0; k < shapes.size(); ++k) {
      const Shape& sh = shapes[k];
      std::vector<Session*> sessions;
      std::vector<int> ids;
      std::vector<std::vector<int>> fed;
      for (std::size_t j = 0; j < sh.order.size(); ++j) {
        const int i = sh.order[j], n = sh.lens[j];
        std::vector<int> piece;
        if (i == 2) piece.assign(p2.begin() + static_cast<std::ptrdiff_t>(at2), p2.begin() + static_cast<std::ptrdiff_t>(at2 + n)), at2 += n;
        else if (i == 3 && n > 1) piece.assign(p2.begin() + static_cast<std::ptrdiff_t>(at3), p2.begin() + static_cast<std::ptrdiff_t>(at3 + n)), at3 += n;
        else piece.assign(n, next[i]);
        sessions.push_back(&batch[i]);
        ids.insert(ids.end(), piece.begin(), piece.end());
        fed.push_back(piece);
      }
      std::vector<float> buf;
      const std::span<const float> l = e->forward_segments_view(sessions, sh.lens, ids, buf);
      ASSERT_EQ(l.size(), sh.order.size() * V) << "shape " << k;
      for (std::size_t j = 0; j < sh.order.size(); ++j) {
        const int i = sh.order[j];
        const std::vector<float> alone = e->forward(solo[i], fed[j]);
        const std::vector<float> row(l.begin() + static_cast<std::ptrdiff_t>(j * V), l.begin() + static_cast<std::ptrdiff_t>((j + 1) * V));
        if (ref) {
          ASSERT_EQ(row, alone) << "shape " << k << " session " << i;
        } else {
          float m = 0;
          for (int v = 0; v < V; ++v) m = std::max(m, std::fabs(row[v] - alone[v]));
          ASSERT_LT(m, 1e-3f) << "shape " << k << " session " << i;
        }
        const int a = static_cast<int>(std::max_element(row.begin(), row.end()) - row.begin());
        ASSERT_EQ(a, static_cast<int>(std::max_element(alone.begin(), alone.end()) - alone.begin())) << "shape " << k << " session " << i;
        next[i] = a;
        EXPECT_EQ(batch[i].n_past, solo[i].n_past) << "shape " << k << " session " << i;
      }
    }
  }
  // Bad segments throw before anything is stepped.
  Session a = engine_->new_session(), b = engine_->new_session();
  std::vector<Session*> ab = {&a, &b}, aa = {&a, &a};
  std::vector<float> buf;
  EXPECT_THROW(engine_->forward_segments_view(ab, std::vector<int>{1}, std::vector<int>{1, 2}, buf), Error);        // a length missing
  EXPECT_THROW(engine_->forward_segments_view(ab, std::vector<int>{0, 2}, std::vector<int>{1, 2}, buf), Error);     // an empty segment
  EXPECT_THROW(engine_->forward_segments_view(ab, std::vector<int>{2, 2}, std::vector<int>{1, 2, 3}, buf), Error);  // ids short
  EXPECT_THROW(engine_->forward_segments_view(aa, std::vector<int>{2, 1}, std::vector<int>{1, 2, 3}, buf), Error);  // a session twice
  EXPECT_THROW(engine_->forward_segments_view(ab, std::vector<int>{2, 1}, std::vector<int>{1, V, 3}, buf), Error);  // outside the vocabulary
  Engine small(model_->spec(), *backend_, 4);
  EXPECT_THROW(small.forward_segments_view(ab, std::vector<int>{3, 2}, std::vector<int>{1, 2, 3, 4, 5}, buf), Error);  // over the chunk
  EXPECT_EQ(a.n_past, 0);
  EXPECT_EQ(b.n_past, 0);
  // The CPU backend keeps its logits on the host: no greedy ids of its own, nothing stepped.
  std::vector<int> got;
  EXPECT_FALSE(engine_->forward_segments_greedy(ab, std::vector<int>{2, 1}, std::vector<int>{1, 2, 3}, got));
  EXPECT_EQ(a.n_past, 0);
}

TEST_P(Fixture, StateSizeIsConstantExceptTheKvCache) {
  // Decode cost per token grows only with the attention layers' KV reads:
  // the Gated DeltaNet state has a fixed size, the KV cache one row per token.
  const auto& spec = model_->spec();
  Session s = engine_->new_session();
  auto& st = static_cast<cpu::CpuState&>(*s.state);
  std::vector<std::size_t> gdn0;
  for (const auto& l : st.layers) gdn0.push_back(l.S.size() + l.conv.size());
  const std::vector<int> ids = goldens()["prompts"][2]["ids"];
  engine_->forward(s, ids);
  for (int l = 0; l < spec.num_layers; ++l) {
    const auto& ls = st.layers[l];
    EXPECT_EQ(ls.S.size() + ls.conv.size(), gdn0[l]);
    const std::size_t kv_row = spec.layer_kinds[l] == LayerKind::kFullAttention ? std::size_t(spec.num_kv_heads) * spec.head_dim : 0;
    EXPECT_EQ(ls.k.size(), ids.size() * kv_row);
  }
}

INSTANTIATE_TEST_SUITE_P(BothLayouts, Fixture, ::testing::Values("tiny-qwen35moe-text", "tiny-qwen35moe-vl"));
