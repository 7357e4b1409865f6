"""A tiny random GLM-5 (GlmMoeDsaForCausalLM) checkpoint and transformers' own fp64 logits for it.

Run where torch and transformers are installed (transformers 5.17):
    python3 make_glm_moe_dsa.py OUT_DIR
Writes OUT_DIR/glm_moe_dsa/ like make_deepseek_v3.py does: config.json (transformers' own
serialisation), model.safetensors (fp32, hub names) and reference_logits.safetensors (`ids`,
`logits` float64 from GlmMoeDsaForCausalLM.from_pretrained in float64). The DSA indexer keeps 12
of up to 40 positions, so sparsity changes the result; layers alternate full / shared indexers
(a shared layer reuses the previous full layer's selection). 16 indexer heads make an all-zero
ReLU score (a tie at the top-k boundary) improbable.
"""
import os
import sys

import numpy as np
import torch
from safetensors.numpy import save_file
from transformers import GlmMoeDsaConfig, GlmMoeDsaForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_deepseek_v3 import weights  # noqa: E402  (MLA, MoE, norms, head: the same layout)

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


def main():
    d = os.path.join(sys.argv[1], "glm_moe_dsa")
    os.makedirs(d, exist_ok=True)
    cfg = GlmMoeDsaConfig(**CONFIG)
    cfg.architectures = ["GlmMoeDsaForCausalLM"]
    cfg.save_pretrained(d)
    rng = np.random.default_rng(2000)
    w = weights(cfg, rng)
    h, ih, ihd = cfg.hidden_size, cfg.index_n_heads, cfg.index_head_dim
    for i, kind in enumerate(cfg.indexer_types):
        if kind != "full":
            continue
        p = f"model.layers.{i}.self_attn.indexer."
        w[p + "wq_b.weight"] = (rng.standard_normal((ih * ihd, cfg.q_lora_rank))
                                / np.sqrt(cfg.q_lora_rank)).astype(np.float32)
        w[p + "wk.weight"] = (rng.standard_normal((ihd, h)) / np.sqrt(h)).astype(np.float32)
        w[p + "k_norm.weight"] = (1.0 + 0.2 * rng.standard_normal(ihd)).astype(np.float32)
        w[p + "k_norm.bias"] = (0.2 * rng.standard_normal(ihd)).astype(np.float32)
        w[p + "weights_proj.weight"] = (rng.standard_normal((ih, h)) / np.sqrt(h)).astype(np.float32)
    save_file(w, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
    model, info = GlmMoeDsaForCausalLM.from_pretrained(
        d, dtype=torch.float64, output_loading_info=True, attn_implementation="eager",
        experts_implementation="eager")  # grouped_mm has no float64
    bad = {key: val for key, val in info.items() if val}
    if bad:
        raise SystemExit(f"loading info {bad}")
    ids = torch.tensor([(i * 37 + 5) % cfg.vocab_size for i in range(40)], dtype=torch.int64)
    with torch.no_grad():
        logits = model(ids[None, :]).logits[0].to(torch.float64).numpy()
    save_file({"ids": ids.numpy(), "logits": logits}, os.path.join(d, "reference_logits.safetensors"))
    print("glm_moe_dsa logits", logits.shape, "argmax", logits.argmax(-1)[:8].tolist())


if __name__ == "__main__":
    main()
