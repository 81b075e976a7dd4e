#include "model/model_spec.h"

#include <gtest/gtest.h>

#include "test_util.h"
#include "util/error.h"

using namespace coli;

TEST(ModelSpec, TextOnlyLayout) {
  ModelSpec s = load_model_spec(test::data_dir() + "/tiny-qwen35moe-text");
  EXPECT_EQ(s.model_type, "qwen3_5_moe_text");
  EXPECT_FALSE(s.multimodal);
  EXPECT_EQ(s.tensor_prefix, "model.");
  EXPECT_EQ(s.hidden_size, 64);
  EXPECT_EQ(s.num_layers, 8);
  EXPECT_EQ(s.num_attention_layers(), 2);
  EXPECT_EQ(s.layer_kinds[3], LayerKind::kFullAttention);
  EXPECT_EQ(s.layer_kinds[4], LayerKind::kLinearAttention);
  EXPECT_EQ(s.head_dim, 32);
  EXPECT_EQ(s.rotary_dim, 8);  // 32 * 0.25
  EXPECT_EQ(s.rope_theta, 10000.0);
  EXPECT_EQ(s.linear_conv_dim(), 2 * 2 * 16 + 4 * 16);
  EXPECT_EQ(s.num_experts, 16);
  EXPECT_EQ(s.num_experts_per_tok, 4);
  EXPECT_EQ(s.shared_expert_intermediate_size, 48);
  EXPECT_EQ(s.eos_token_ids, std::vector<int>{511});
}

TEST(ModelSpec, MultimodalLayout) {
  ModelSpec s = load_model_spec(test::data_dir() + "/tiny-qwen35moe-vl");
  EXPECT_EQ(s.model_type, "qwen3_5_moe");
  EXPECT_TRUE(s.multimodal);
  EXPECT_EQ(s.tensor_prefix, "model.language_model.");
  EXPECT_EQ(s.vocab_size, 512);
  EXPECT_EQ(s.rotary_dim, 8);
}

TEST(ModelSpec, RealShapedDefaults) {
  // The Qwen3.6-35B-A3B text config with the keys transformers derives left out.
  ModelSpec s = parse_model_spec(R"({"model_type":"qwen3_5_moe","text_config":{
      "vocab_size":248320,"hidden_size":2048,"num_hidden_layers":40,"num_attention_heads":16,
      "num_key_value_heads":2,"head_dim":256,"linear_conv_kernel_dim":4,"linear_key_head_dim":128,
      "linear_value_head_dim":128,"linear_num_key_heads":16,"linear_num_value_heads":32,
      "moe_intermediate_size":512,"shared_expert_intermediate_size":512,"num_experts":256,
      "num_experts_per_tok":8,"rope_parameters":{"rope_type":"default","rope_theta":10000000,
      "partial_rotary_factor":0.25,"mrope_section":[11,11,10],"mrope_interleaved":true},
      "eos_token_id":[248046,248044]}})",
                                 "config.json");
  EXPECT_EQ(s.rotary_dim, 64);
  EXPECT_EQ(s.num_attention_layers(), 10);
  EXPECT_EQ(s.layer_kinds[0], LayerKind::kLinearAttention);
  EXPECT_EQ(s.layer_kinds[3], LayerKind::kFullAttention);
  EXPECT_EQ(s.linear_conv_dim(), 8192);
  EXPECT_EQ(s.eos_token_ids, (std::vector<int>{248046, 248044}));
}

TEST(ModelSpec, OtherModelTypeIsAnError) {
  try {
    parse_model_spec(R"({"model_type":"llama","hidden_size":8})", "x/config.json");
    FAIL();
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("x/config.json"), std::string::npos);
    EXPECT_NE(m.find("'llama'"), std::string::npos);
    EXPECT_EQ(m.find('\n'), std::string::npos);
  }
}

TEST(ModelSpec, MissingOrBadKeysAreNamed) {
  try {
    parse_model_spec(R"({"model_type":"qwen3_5_moe_text","vocab_size":8})", "config.json");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'hidden_size' is missing"), std::string::npos) << e.what();
  }
  EXPECT_THROW(parse_model_spec("{", "config.json"), Error);
  EXPECT_THROW(parse_model_spec(R"({"model_type":"qwen3_5_moe_text","vocab_size":-3})", "config.json"), Error);
}
