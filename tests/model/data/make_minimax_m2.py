"""A tiny random MiniMax-M2 checkpoint and transformers' fp64 logits.

Run where torch and transformers are installed (transformers 5.17):  python3 make_minimax_m2.py OUT
Writes OUT/minimax_m2/: config.json and model.safetensors (fp32, from save_pretrained) and
reference_logits.safetensors (`ids`, `logits` float64 from MiniMaxM2ForCausalLM in float64, its
eager experts). The config exercises every MiniMax-M2 trait: q_norm / k_norm over the whole
projection (all heads at once, not per head), RoPE over half of each head (partial_rotary_factor
0.5), and in every layer a sigmoid router whose e_score_correction_bias (a buffer, set here to
values large enough to change the choice) picks the top 2 of 8 experts, their sigmoid scores
renormalised to sum to 1. Widths are multiples of 128 so `exl3 quantize` converts it unpadded.
The tensor names it prints are the checkpoint's (block_sparse_moe.* as MiniMax ships them).
"""
import os
import sys

import torch
from safetensors import safe_open
from transformers import MiniMaxM2Config, MiniMaxM2ForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_deepseek_v3 import randomize, write_reference  # noqa: E402


def main():
    d = os.path.join(sys.argv[1], "minimax_m2")
    cfg = MiniMaxM2Config(
        vocab_size=256, hidden_size=128, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, num_local_experts=8,
        num_experts_per_tok=2, max_position_embeddings=256, rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                         "partial_rotary_factor": 0.5},
        tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)
    cfg.architectures = ["MiniMaxM2ForCausalLM"]
    torch.manual_seed(5000)  # before the model: its init draws from the same stream
    model = MiniMaxM2ForCausalLM(cfg)
    randomize(model)
    with torch.no_grad():
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(0.3 * torch.randn_like(b))
    model.save_pretrained(d, safe_serialization=True)
    with safe_open(os.path.join(d, "model.safetensors"), "pt") as f:
        names = sorted(f.keys())
    print("\n".join(n for n in names if "layers.0." in n))
    print(open(os.path.join(d, "config.json")).read())
    write_reference(d, MiniMaxM2ForCausalLM, cfg.vocab_size, experts_implementation="eager")


if __name__ == "__main__":
    main()
