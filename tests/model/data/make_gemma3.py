"""A tiny random Gemma 3 text checkpoint and transformers' fp64 logits.

Run where torch and transformers are installed (transformers 5.17):  python3 make_gemma3.py OUT
Writes OUT/gemma3/: config.json and model.safetensors (fp32, from save_pretrained; the head is
tied, so no lm_head) and reference_logits.safetensors (`ids`, `logits` float64 from
Gemma3ForCausalLM.from_pretrained in float64). The config exercises every Gemma 3 trait: sliding
and full layers mixed (window 8, far shorter than the 40 test positions), their own RoPE (local
base 10000, global 50000 with linear scaling), query_pre_attn_scalar 48 against head_dim 32,
final logit soft-capping low enough to bite, and the sandwich norms. attn_logit_softcapping is set
as well: transformers' Gemma 3 never applies it, and the test checks that exl3 does not. Widths are
multiples of 128 so `exl3 quantize` converts it without padding, and the 384 ids fit the
synthetic byte-level tokenizer the calibrated conversion test gives it.
"""
import os
import sys

import torch
from transformers import Gemma3ForCausalLM, Gemma3TextConfig

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_deepseek_v3 import randomize, write_reference  # noqa: E402


def main():
    d = os.path.join(sys.argv[1], "gemma3")
    cfg = Gemma3TextConfig(
        vocab_size=384, hidden_size=128, intermediate_size=256, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, query_pre_attn_scalar=48,
        sliding_window=8,
        layer_types=["sliding_attention", "sliding_attention", "full_attention",
                     "sliding_attention"],
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 50000.0},
        },
        attn_logit_softcapping=2.0, final_logit_softcapping=3.0, max_position_embeddings=256,
        rms_norm_eps=1e-6, tie_word_embeddings=True, pad_token_id=0, bos_token_id=2,
        eos_token_id=1)
    cfg.architectures = ["Gemma3ForCausalLM"]
    torch.manual_seed(5000)  # before the model: its init draws from the same stream
    model = Gemma3ForCausalLM(cfg)
    randomize(model)
    with torch.no_grad():  # Gemma's norms scale by (1 + w): weights near 0 keep the scale near 1
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.sub_(1.0)
    model.save_pretrained(d, safe_serialization=True)
    write_reference(d, Gemma3ForCausalLM, cfg.vocab_size)


if __name__ == "__main__":
    main()
