"""A tiny random MixtralForCausalLM for the CUDA engine (head_dim 64, no sliding window, hidden and
experts 128 wide, 4 experts, top 2), written with save_pretrained to the folder given. Then
`exl3 quantize FOLDER .devmx --bits 4` and `bash bench/run_mixtral_on_device.sh OUT` on the GPU
machine compare the CUDA engine with the CPU engine on it. Needs torch and transformers 5.17.
Usage: python3 bench/make_tiny_mixtral.py FOLDER
"""
import os
import sys

import torch
from transformers import MixtralConfig, MixtralForCausalLM

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "model",
                                "data"))
from make_deepseek_v3 import randomize  # noqa: E402


def main():
    cfg = MixtralConfig(vocab_size=256, hidden_size=128, intermediate_size=128, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                        sliding_window=None, num_local_experts=4, num_experts_per_tok=2,
                        max_position_embeddings=512, rms_norm_eps=1e-5, tie_word_embeddings=False,
                        bos_token_id=1, eos_token_id=2)
    torch.manual_seed(6000)  # before the model: its init draws from the same stream
    model = MixtralForCausalLM(cfg)
    randomize(model)
    model.save_pretrained(sys.argv[1], safe_serialization=True)


if __name__ == "__main__":
    main()
