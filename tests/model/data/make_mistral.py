"""A tiny random Mistral checkpoint with sliding-window attention and transformers' fp64 logits.

Run where torch and transformers are installed (transformers 5.17):  python3 make_mistral.py OUT
Writes OUT/mistral_window/: config.json and model.safetensors (fp32, from save_pretrained) and
reference_logits.safetensors (`ids`, `logits` float64 from MistralForCausalLM.from_pretrained in
float64). The window (8) is far shorter than the 40 test positions, so it changes the result.
"""
import os
import sys

import torch
from transformers import MistralConfig, MistralForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_deepseek_v3 import randomize, write_reference  # noqa: E402


def main():
    d = os.path.join(sys.argv[1], "mistral_window")
    cfg = MistralConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=8,
                        max_position_embeddings=256, rms_norm_eps=1e-5, tie_word_embeddings=False,
                        bos_token_id=1, eos_token_id=2)
    torch.manual_seed(4000)  # before the model: its init draws from the same stream
    model = MistralForCausalLM(cfg)
    randomize(model)
    model.save_pretrained(d, safe_serialization=True)
    write_reference(d, MistralForCausalLM, cfg.vocab_size)

if __name__ == "__main__":
    main()
