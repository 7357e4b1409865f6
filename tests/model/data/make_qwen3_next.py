"""A tiny random Qwen3-Next checkpoint and transformers' logits.

Run where torch and transformers are installed (transformers 5.25, CPU torch):
    python3 make_qwen3_next.py OUT
Writes OUT/qwen3_next/: config.json, model.safetensors (bf16, from save_pretrained) and
reference_logits.safetensors (`ids`, `logits` float64 from Qwen3NextForCausalLM loaded in float64
with eager attention and experts).

The config exercises every Qwen3-Next trait: gated DeltaNet layers (linear_attention) around one
gated full-attention layer; 2 key heads serving 4 value heads (each q/k head feeds two value heads);
a causal depthwise convolution of width 4; partial rotary (a quarter of head_dim) with per-head
(1 + w) q/k norms; the attention output gated by the sigmoid half of q_proj; routed experts with a
shared expert behind a sigmoid gate, and one dense layer (mlp_only_layers). Expert widths are 128
so `exl3 quantize` converts it (EXL3 experts are stored unpadded). The 80 reference
positions are more than one 64-token chunk of transformers' chunked delta rule. Decays are drawn
so the recurrent state keeps a memory over tens of tokens (A = exp(A_log) in [0.02, 0.5]).

transformers computes the delta rule itself in float32 whatever the model's dtype, so the
reference is float32-exact there and float64 elsewhere.
"""
import os
import sys

import torch
from safetensors.numpy import save_file
from transformers import Qwen3NextConfig, Qwen3NextForCausalLM


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


def main():
    d = os.path.join(sys.argv[1], "qwen3_next")
    cfg = Qwen3NextConfig(
        vocab_size=256, hidden_size=128, intermediate_size=192, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32,
        layer_types=["linear_attention", "full_attention", "linear_attention",
                     "linear_attention"],
        linear_conv_kernel_dim=4, linear_key_head_dim=32, linear_value_head_dim=32,
        linear_num_key_heads=2, linear_num_value_heads=4, num_experts=4, num_experts_per_tok=2,
        moe_intermediate_size=128, shared_expert_intermediate_size=96, decoder_sparse_step=1,
        mlp_only_layers=[2], norm_topk_prob=True,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                         "partial_rotary_factor": 0.25},
        max_position_embeddings=256, rms_norm_eps=1e-6, tie_word_embeddings=False,
        bos_token_id=1, eos_token_id=2, pad_token_id=0)
    cfg.architectures = ["Qwen3NextForCausalLM"]
    torch.manual_seed(6000)
    model = Qwen3NextForCausalLM(cfg)
    randomize(model)
    model.to(torch.bfloat16).save_pretrained(d, safe_serialization=True)

    ref, info = Qwen3NextForCausalLM.from_pretrained(
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


if __name__ == "__main__":
    main()
