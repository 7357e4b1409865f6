"""A tiny random Mixtral checkpoint (sliding window, 4 experts, top-2) and transformers' fp64 logits.

Run where torch and transformers are installed (transformers 5.17):  python3 make_mixtral.py OUT
Writes OUT/mixtral/: config.json and model.safetensors (fp32, from save_pretrained: the experts as
block_sparse_moe.experts.E.{w1,w2,w3}, the router as block_sparse_moe.gate) and
reference_logits.safetensors (`ids`, `logits` float64 from MixtralForCausalLM in float64, its
eager experts). The window (8) is shorter than the 40 test positions, and hidden 128 / experts 128
wide lets the conversion tests quantize it without padding.
"""
import os
import sys

import torch
from safetensors import safe_open
from transformers import MixtralConfig, MixtralForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_deepseek_v3 import randomize, write_reference  # noqa: E402


def main():
    d = os.path.join(sys.argv[1], "mixtral")
    cfg = MixtralConfig(vocab_size=256, hidden_size=128, intermediate_size=128, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=32, sliding_window=8,
                        num_local_experts=4, num_experts_per_tok=2, max_position_embeddings=256,
                        rms_norm_eps=1e-5, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(5000)  # before the model: its init draws from the same stream
    model = MixtralForCausalLM(cfg)
    randomize(model)
    model.save_pretrained(d, safe_serialization=True)
    with safe_open(os.path.join(d, "model.safetensors"), "pt") as f:
        names = sorted(f.keys())
    print("\n".join(n for n in names if "layers.0." in n))
    write_reference(d, MixtralForCausalLM, cfg.vocab_size, experts_implementation="eager")


if __name__ == "__main__":
    main()
