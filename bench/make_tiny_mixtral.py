"""A tiny random MixtralForCausalLM for the CUDA engine (head_dim 64, no sliding window, hidden and
experts 128 wide, 4 experts, top 2), written with save_pretrained to the folder given. Then
`exl3 quantize FOLDER .devmx --bits 4` and `bash bench/run_mixtral_on_device.sh OUT` on the GPU
machine compare the CUDA engine with the CPU engine on it. Needs torch and transformers 5.17.
"""
import sys, torch
from transformers import MixtralConfig, MixtralForCausalLM
cfg = MixtralConfig(vocab_size=256, hidden_size=128, intermediate_size=128, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=64, sliding_window=None,
                    num_local_experts=4, num_experts_per_tok=2, max_position_embeddings=512,
                    rms_norm_eps=1e-5, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)
torch.manual_seed(6000)
m = MixtralForCausalLM(cfg)
with torch.no_grad():
    for n, p in m.named_parameters():
        p.copy_(1.0 + 0.2 * torch.randn_like(p) if n.endswith("norm.weight") else torch.randn_like(p) / (p.shape[-1] ** 0.5 if p.dim() > 1 else 1.0))
m.save_pretrained(sys.argv[1], safe_serialization=True)
