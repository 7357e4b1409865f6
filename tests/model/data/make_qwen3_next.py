"""Tiny random Qwen3-Next and Qwen3.5 text checkpoints and transformers' logits.

Run where torch and transformers are installed (transformers 5.25, CPU torch):
    python3 make_qwen3_next.py OUT
Writes OUT/qwen3_next/, OUT/qwen3_5_moe/ and OUT/qwen3_5/: config.json, model.safetensors (bf16,
from save_pretrained) and reference_logits.safetensors (`ids`, `logits` float64 from the model
loaded in float64 with eager attention and experts).

The config exercises every Qwen3-Next trait: gated DeltaNet layers (linear_attention) around one
gated full-attention layer; 2 key heads serving 4 value heads (each q/k head feeds two value heads);
a causal depthwise convolution of width 4; partial rotary (a quarter of head_dim) with per-head
(1 + w) q/k norms; the attention output gated by the sigmoid half of q_proj; routed experts with a
shared expert behind a sigmoid gate, and one dense layer (mlp_only_layers). Expert widths are 128
so `exl3 quantize` converts it (EXL3 experts are stored unpadded). The 80 reference
positions are more than one 64-token chunk of transformers' chunked delta rule. Decays are drawn
so the recurrent state keeps a memory over tens of tokens (A = exp(A_log) in [0.02, 0.5]).

Qwen3.5 (Qwen3_5MoeForCausalLM, Qwen3_5ForCausalLM) is the same stack with the DeltaNet's inputs
from four projections (in_proj_qkv, _z, _b, _a) and Qwen3-VL's interleaved multimodal RoPE
(mrope_section), which for text is plain RoPE; the MoE model has experts in every layer, the dense
one SwiGLU MLPs.

transformers computes the delta rule itself in float32 whatever the model's dtype, so the
reference is float32-exact there and float64 elsewhere.
"""
import os
import sys

import torch
from safetensors.numpy import save_file
from transformers import (Qwen3_5ForCausalLM, Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig,
                          Qwen3_5TextConfig, Qwen3NextConfig, Qwen3NextForCausalLM)


def randomize(model):
    """Weights N(0, 1) / sqrt(fan-in); the (1 + w) norms w ~ 0.2 N(0, 1); the gated norm's weight
    1 + 0.2 N(0, 1); conv taps N(0, 1) / 2; dt_bias N(0, 0.5^2); A_log as the docstring says; all
    rounded to bf16."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("linear_attn.norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            elif name.endswith("norm.weight"):
                p.copy_(0.2 * torch.randn_like(p))
            elif name.endswith("A_log"):
                p.copy_(torch.log(torch.empty_like(p).uniform_(0.02, 0.5)))
            elif name.endswith("dt_bias"):
                p.copy_(0.5 * torch.randn_like(p))
            elif name.endswith("conv1d.weight"):
                p.copy_(0.5 * torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) / p.shape[-1] ** 0.5)
            p.copy_(p.to(torch.bfloat16).to(p.dtype))


LAYERS = dict(
    vocab_size=256, hidden_size=128, num_hidden_layers=4, num_attention_heads=4,
    num_key_value_heads=2, head_dim=32,
    layer_types=["linear_attention", "full_attention", "linear_attention", "linear_attention"],
    linear_conv_kernel_dim=4, linear_key_head_dim=32, linear_value_head_dim=32,
    linear_num_key_heads=2, linear_num_value_heads=4, max_position_embeddings=256,
    rms_norm_eps=1e-6, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0)
MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=128,
           shared_expert_intermediate_size=96)
MROPE = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25,
         "mrope_section": [2, 1, 1], "mrope_interleaved": True}


def make(out, name, config_cls, model_cls, seed, **extra):
    d = os.path.join(out, name)
    cfg = config_cls(**{**LAYERS, **extra})
    cfg.architectures = [model_cls.__name__]
    torch.manual_seed(seed)  # before the model: its init draws from the same stream
    model = model_cls(cfg)
    randomize(model)
    model.to(torch.bfloat16).save_pretrained(d, safe_serialization=True)

    ref, info = model_cls.from_pretrained(
        d, dtype=torch.float64, output_loading_info=True, attn_implementation="eager",
        experts_implementation="eager")
    bad = {key: val for key, val in info.items() if val}
    if bad:
        raise SystemExit(f"{d}: loading info {bad}")
    ids = torch.tensor([(i * 37 + 5) % cfg.vocab_size for i in range(80)], dtype=torch.int64)
    with torch.no_grad():
        logits = ref(ids[None, :]).logits[0].to(torch.float64).numpy()
    save_file({"ids": ids.numpy(), "logits": logits},
              os.path.join(d, "reference_logits.safetensors"))
    print(d, "logits", logits.shape, "argmax", logits.argmax(-1)[:8].tolist())


def main():
    out = sys.argv[1]
    make(out, "qwen3_next", Qwen3NextConfig, Qwen3NextForCausalLM, 6000, **MOE,
         intermediate_size=192, decoder_sparse_step=1, mlp_only_layers=[2], norm_topk_prob=True,
         rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                          "partial_rotary_factor": 0.25})
    make(out, "qwen3_5_moe", Qwen3_5MoeTextConfig, Qwen3_5MoeForCausalLM, 6001, **MOE,
         rope_parameters=MROPE)
    make(out, "qwen3_5", Qwen3_5TextConfig, Qwen3_5ForCausalLM, 6002, intermediate_size=192,
         rope_parameters=MROPE)


if __name__ == "__main__":
    main()
