"""A tiny random Kimi-Linear checkpoint and transformers' logits.

Run where torch and transformers are installed (transformers 5.25, CPU torch):
    python3 make_kimi_linear.py OUT
Writes OUT/kimi_linear/: config.json, model.safetensors (bf16 except what transformers keeps in
fp32: the router weight, its e_score_correction_bias and dt_bias; from save_pretrained) and
reference_logits.safetensors (`ids`, `logits` float64 from KimiLinearForCausalLM loaded in float64
with eager attention and experts).

The config exercises every Kimi-Linear trait: Kimi delta attention (KDA) layers around one
multi-head latent attention layer without RoPE (plain q_proj; the "rope" part of the key is shared
but never rotated); KDA's separate q/k/v projections through a causal depthwise convolution of
width 4, its per-channel forget gate (f_a_proj -> f_b_proj + dt_bias, scaled by exp(A_log) per
head), write strength sigmoid(b_proj), and output gate (g_a_proj -> g_b_proj) through a sigmoid-gated
RMSNorm; a dense first layer, then MoE layers with a sigmoid router choosing 2 of 8 experts among the
best of 2 groups (correction bias, routed_scaling_factor) plus a shared expert. 80 positions, more
than one 64-token chunk of transformers' chunked rule. Decays are drawn so the state keeps a memory
over tens of tokens.

transformers computes the delta rule itself in float32 whatever the model's dtype, so the reference
is float32-exact there and float64 elsewhere.
"""
import os
import sys

import torch
from safetensors.numpy import save_file
from transformers import KimiLinearConfig, KimiLinearForCausalLM


def randomize(model):
    """Weights N(0, 1) / sqrt(fan-in); norms 1 + 0.2 N(0, 1); conv taps N(0, 1) / 2; dt_bias
    N(0, 0.5^2); exp(A_log) in [0.02, 0.5]; the router's correction bias N(0, 0.1^2); all rounded
    to bf16."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            elif name.endswith("A_log"):
                p.copy_(torch.log(torch.empty_like(p).uniform_(0.02, 0.5)))
            elif name.endswith("dt_bias"):
                p.copy_(0.5 * torch.randn_like(p))
            elif name.endswith("conv1d.weight"):
                p.copy_(0.5 * torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) / p.shape[-1] ** 0.5)
            p.copy_(p.to(torch.bfloat16).to(p.dtype))
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_((0.1 * torch.randn_like(b)).to(torch.bfloat16).to(b.dtype))


def main():
    d = os.path.join(sys.argv[1], "kimi_linear")
    cfg = KimiLinearConfig(
        vocab_size=256, hidden_size=128, intermediate_size=192, moe_intermediate_size=128,
        num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=64,
        q_lora_rank=None, qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32,
        layer_types=["linear_attention", "full_attention", "linear_attention",
                     "linear_attention"],
        mlp_layer_types=["dense", "sparse", "sparse", "sparse"],
        num_local_experts=8, num_experts_per_tok=2, n_group=2, topk_group=1,
        routed_scaling_factor=2.446, n_shared_experts=1, norm_topk_prob=True,
        linear_head_dim=32, linear_num_heads=4, linear_conv_kernel_dim=4,
        max_position_embeddings=256, rms_norm_eps=1e-5, tie_word_embeddings=False,
        bos_token_id=1, eos_token_id=2, pad_token_id=0)
    cfg.architectures = ["KimiLinearForCausalLM"]
    torch.manual_seed(7000)  # before the model: its init draws from the same stream
    model = KimiLinearForCausalLM(cfg)
    randomize(model)
    model.to(torch.bfloat16).save_pretrained(d, safe_serialization=True)

    ref, info = KimiLinearForCausalLM.from_pretrained(
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
