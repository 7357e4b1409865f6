"""Tiny random DeepSeek-V3 checkpoints and transformers' own fp64 logits for them.

Run where torch and transformers are installed (the device machine: torch 2.11, transformers
5.17):  python3 make_deepseek_v3.py OUT_DIR [CASE...]
For each case it writes OUT_DIR/<case>/ with config.json (transformers' own serialisation of the
config), model.safetensors (fp32, Hugging Face hub tensor names, per-expert), and
reference_logits.safetensors (`ids` int64 [n], `logits` float64 [n, vocab] from
DeepseekV3ForCausalLM.from_pretrained of that folder in float64). The weights are drawn larger
than the init's so that attention, routing and the norms matter; the router's correction bias is
random so grouped top-k selection differs from plain top-k.
"""
import os
import sys

import numpy as np
import torch
from safetensors.numpy import save_file
from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

BASE = dict(
    vocab_size=256, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
    num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4, n_shared_experts=1,
    n_routed_experts=8, num_experts_per_tok=2, first_k_dense_replace=1, kv_lora_rank=32,
    qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, max_position_embeddings=256,
    rms_norm_eps=1e-6, tie_word_embeddings=False, bos_token_id=0, eos_token_id=1,
)
CASES = {
    # q LoRA, interleaved RoPE, grouped top-k over 4 groups (2 kept), renormalised weights
    "deepseek_v3_qlora": dict(q_lora_rank=24, rope_interleave=True, n_group=4, topk_group=2,
                              norm_topk_prob=True, routed_scaling_factor=2.5),
    # plain q_proj, half-split RoPE with DeepSeek's yarn (mscale), no renormalisation
    "deepseek_v3_yarn": dict(q_lora_rank=None, rope_interleave=False, n_group=2, topk_group=1,
                             norm_topk_prob=False, routed_scaling_factor=1.5,
                             rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0,
                                              "factor": 4.0, "original_max_position_embeddings": 16,
                                              "beta_fast": 32.0, "beta_slow": 1.0,
                                              "mscale": 1.0, "mscale_all_dim": 1.0}),
    # every expert width a multiple of 128 (EXL3 experts are not padded), for the conversion test
    "deepseek_v3_q128": dict(hidden_size=128, intermediate_size=192, moe_intermediate_size=128,
                             n_routed_experts=4, n_group=2, topk_group=1, q_lora_rank=96,
                             kv_lora_rank=64, rope_interleave=True, norm_topk_prob=True,
                             routed_scaling_factor=2.0),
}


def weights(cfg, rng):
    h, v = cfg.hidden_size, cfg.vocab_size
    heads, nope, rope, vd = (cfg.num_attention_heads, cfg.qk_nope_head_dim,
                             cfg.qk_rope_head_dim, cfg.v_head_dim)
    lora = cfg.kv_lora_rank
    w = {}

    def lin(name, out, inp, scale=None):
        s = scale if scale is not None else 1.0 / np.sqrt(inp)
        w[name] = (rng.standard_normal((out, inp)) * s).astype(np.float32)

    def norm(name, n):
        w[name] = (1.0 + 0.2 * rng.standard_normal(n)).astype(np.float32)

    w["model.embed_tokens.weight"] = rng.standard_normal((v, h)).astype(np.float32)
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        norm(p + "input_layernorm.weight", h)
        norm(p + "post_attention_layernorm.weight", h)
        a = p + "self_attn."
        if cfg.q_lora_rank is None:
            lin(a + "q_proj.weight", heads * (nope + rope), h)
        else:
            lin(a + "q_a_proj.weight", cfg.q_lora_rank, h)
            norm(a + "q_a_layernorm.weight", cfg.q_lora_rank)
            lin(a + "q_b_proj.weight", heads * (nope + rope), cfg.q_lora_rank)
        lin(a + "kv_a_proj_with_mqa.weight", lora + rope, h)
        norm(a + "kv_a_layernorm.weight", lora)
        lin(a + "kv_b_proj.weight", heads * (nope + vd), lora)
        lin(a + "o_proj.weight", h, heads * vd)
        m = p + "mlp."
        if i < cfg.first_k_dense_replace:
            lin(m + "gate_proj.weight", cfg.intermediate_size, h)
            lin(m + "up_proj.weight", cfg.intermediate_size, h)
            lin(m + "down_proj.weight", h, cfg.intermediate_size)
            continue
        lin(m + "gate.weight", cfg.n_routed_experts, h)
        w[m + "gate.e_score_correction_bias"] = (
            0.5 * rng.standard_normal(cfg.n_routed_experts)).astype(np.float32)
        inter = cfg.moe_intermediate_size
        for e in range(cfg.n_routed_experts):
            lin(m + f"experts.{e}.gate_proj.weight", inter, h)
            lin(m + f"experts.{e}.up_proj.weight", inter, h)
            lin(m + f"experts.{e}.down_proj.weight", h, inter)
        sh = inter * cfg.n_shared_experts
        lin(m + "shared_experts.gate_proj.weight", sh, h)
        lin(m + "shared_experts.up_proj.weight", sh, h)
        lin(m + "shared_experts.down_proj.weight", h, sh)
    norm("model.norm.weight", h)
    lin("lm_head.weight", v, h)
    return w


def randomize(model):
    """Fresh random weights for a transformers model from torch's global generator (its own init
    is too small to make the layers matter): norms 1 + 0.2 N(0, 1), everything else
    N(0, 1) / sqrt(fan-in)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) / (p.shape[-1] ** 0.5 if p.dim() > 1 else 1.0))


def write_reference(d, model_cls, vocab_size, **load_kwargs):
    """Loads folder `d` with transformers in float64 (eager attention; failing on any missing or
    unexpected tensor) and writes reference_logits.safetensors: `ids` (40 fixed ids) and their
    float64 `logits`."""
    model, info = model_cls.from_pretrained(d, dtype=torch.float64, output_loading_info=True,
                                            attn_implementation="eager", **load_kwargs)
    bad = {key: val for key, val in info.items() if val}
    if bad:
        raise SystemExit(f"{d}: loading info {bad}")
    ids = torch.tensor([(i * 37 + 5) % vocab_size for i in range(40)], dtype=torch.int64)
    with torch.no_grad():
        logits = model(ids[None, :]).logits[0].to(torch.float64).numpy()
    save_file({"ids": ids.numpy(), "logits": logits}, os.path.join(d, "reference_logits.safetensors"))
    print(d, "logits", logits.shape, "argmax", logits.argmax(-1)[:8].tolist())


def main():
    out = sys.argv[1]
    only = set(sys.argv[2:])  # case names to (re)write; all when none are given
    for k, (name, extra) in enumerate(CASES.items()):
        if only and name not in only:
            continue
        d = os.path.join(out, name)
        os.makedirs(d, exist_ok=True)
        cfg = DeepseekV3Config(**{**BASE, **extra})
        cfg.architectures = ["DeepseekV3ForCausalLM"]
        cfg.save_pretrained(d)
        rng = np.random.default_rng(1000 + k)
        save_file(weights(cfg, rng), os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
        # grouped_mm (the fused experts) has no float64
        write_reference(d, DeepseekV3ForCausalLM, cfg.vocab_size, experts_implementation="eager")

if __name__ == "__main__":
    main()
