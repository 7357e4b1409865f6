"""Tiny random DeepSeek-sparse-attention checkpoints and transformers' own fp64 logits for them.

Run where torch and transformers are installed (transformers 5.17):
    python3 make_dsa.py OUT_DIR [CASE...]
Writes OUT_DIR/glm_moe_dsa/ (GLM-5: GlmMoeDsaForCausalLM, layers alternating full / shared
indexers, a shared layer reusing the previous full layer's selection) and OUT_DIR/deepseek_v32/
(DeepseekV32ForCausalLM: an indexer in every layer with half-split RoPE, DeepSeek's yarn) like
make_deepseek_v3.py does: config.json (transformers' own serialisation), model.safetensors (fp32,
hub names) and reference_logits.safetensors (`ids`, `logits` float64 from from_pretrained in
float64). The indexers keep 12 of up to 40 positions, so sparsity changes the result; 16 indexer
heads make an all-zero ReLU score (a tie at the top-k boundary) improbable.
"""
import os
import sys

import numpy as np
import torch
from safetensors.numpy import save_file
from transformers import (DeepseekV32Config, DeepseekV32ForCausalLM, GlmMoeDsaConfig,
                          GlmMoeDsaForCausalLM)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_deepseek_v3 import weights, write_reference  # noqa: E402  (the same layout)

CONFIG = dict(
    vocab_size=256, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
    num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4, n_shared_experts=1,
    n_routed_experts=8, num_experts_per_tok=2, first_k_dense_replace=1, kv_lora_rank=32,
    q_lora_rank=24, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
    max_position_embeddings=256, rms_norm_eps=1e-5, tie_word_embeddings=False, bos_token_id=0,
    eos_token_id=1, n_group=2, topk_group=1, norm_topk_prob=True, routed_scaling_factor=2.5,
    index_topk=12, index_head_dim=16, index_n_heads=16,
    indexer_types=["full", "shared", "full", "shared"],
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
)


V32 = dict(CONFIG, n_group=4, topk_group=2, num_hidden_layers=3,
           rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                            "original_max_position_embeddings": 16, "beta_fast": 32.0,
                            "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0})
del V32["indexer_types"]
# GLM-5 with 128-wide experts (EXL3 experts are not padded) and 384 ids (the synthetic byte-level
# tokenizer's), for the calibrated conversion test.
Q128 = dict(CONFIG, vocab_size=384, hidden_size=128, intermediate_size=192,
            moe_intermediate_size=128, n_routed_experts=4, q_lora_rank=96, kv_lora_rank=64,
            index_n_heads=8, num_hidden_layers=3, indexer_types=["full", "shared", "full"])
CASES = {  # name: (config class, model class, config, seed)
    "glm_moe_dsa": (GlmMoeDsaConfig, GlmMoeDsaForCausalLM, CONFIG, 2000),
    "deepseek_v32": (DeepseekV32Config, DeepseekV32ForCausalLM, V32, 3000),
    "glm_moe_dsa_q128": (GlmMoeDsaConfig, GlmMoeDsaForCausalLM, Q128, 4000),
}


def main():
    only = set(sys.argv[2:])  # case names to (re)write; all when none are given
    for name, (config_cls, model_cls, config, seed) in CASES.items():
        if not only or name in only:
            make(os.path.join(sys.argv[1], name), config_cls, model_cls, config, seed)


def make(d, config_cls, model_cls, config, seed):
    os.makedirs(d, exist_ok=True)
    cfg = config_cls(**config)
    cfg.architectures = [model_cls.__name__]
    cfg.save_pretrained(d)
    rng = np.random.default_rng(seed)
    w = weights(cfg, rng)
    h, ih, ihd = cfg.hidden_size, cfg.index_n_heads, cfg.index_head_dim
    for i in range(cfg.num_hidden_layers):
        if getattr(cfg, "indexer_types", ["full"] * cfg.num_hidden_layers)[i] != "full":
            continue
        p = f"model.layers.{i}.self_attn.indexer."
        w[p + "wq_b.weight"] = (rng.standard_normal((ih * ihd, cfg.q_lora_rank))
                                / np.sqrt(cfg.q_lora_rank)).astype(np.float32)
        w[p + "wk.weight"] = (rng.standard_normal((ihd, h)) / np.sqrt(h)).astype(np.float32)
        w[p + "k_norm.weight"] = (1.0 + 0.2 * rng.standard_normal(ihd)).astype(np.float32)
        w[p + "k_norm.bias"] = (0.2 * rng.standard_normal(ihd)).astype(np.float32)
        w[p + "weights_proj.weight"] = (rng.standard_normal((ih, h)) / np.sqrt(h)).astype(np.float32)
    save_file(w, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
    # grouped_mm (the fused experts) has no float64
    write_reference(d, model_cls, cfg.vocab_size, experts_implementation="eager")

if __name__ == "__main__":
    main()
