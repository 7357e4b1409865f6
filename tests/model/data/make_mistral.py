"""A tiny random Mistral checkpoint with sliding-window attention and transformers' fp64 logits.

Run where torch and transformers are installed (transformers 5.17):  python3 make_mistral.py OUT
Writes OUT/mistral_window/: config.json and model.safetensors (fp32, from save_pretrained) and
reference_logits.safetensors (`ids`, `logits` float64 from MistralForCausalLM.from_pretrained in
float64). The window (8) is far shorter than the 40 test positions, so it changes the result.
"""
import os
import sys

import torch
from safetensors.numpy import save_file
from transformers import MistralConfig, MistralForCausalLM


def main():
    d = os.path.join(sys.argv[1], "mistral_window")
    cfg = MistralConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=8,
                        max_position_embeddings=256, rms_norm_eps=1e-5, tie_word_embeddings=False,
                        bos_token_id=1, eos_token_id=2)
    torch.manual_seed(4000)
    model = MistralForCausalLM(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) / (p.shape[-1] ** 0.5 if p.dim() > 1 else 1.0))
    model.save_pretrained(d, safe_serialization=True)
    ref, info = MistralForCausalLM.from_pretrained(d, dtype=torch.float64, output_loading_info=True,
                                                   attn_implementation="eager")
    bad = {key: val for key, val in info.items() if val}
    if bad:
        raise SystemExit(f"loading info {bad}")
    ids = torch.tensor([(i * 37 + 5) % cfg.vocab_size for i in range(40)], dtype=torch.int64)
    with torch.no_grad():
        logits = ref(ids[None, :]).logits[0].to(torch.float64).numpy()
    save_file({"ids": ids.numpy(), "logits": logits}, os.path.join(d, "reference_logits.safetensors"))
    print(d, "logits", logits.shape, "argmax", logits.argmax(-1)[:8].tolist())


if __name__ == "__main__":
    main()
