"""A tiny random gpt-oss checkpoint and transformers' fp64 logits.

Run where torch and transformers are installed (transformers 5.24, CPU torch):
    python3 make_gpt_oss.py OUT
Writes OUT/gpt_oss/: config.json and model.safetensors (bf16, from save_pretrained: the experts
fused as transformers stores them, mlp.experts.gate_up_proj [E, hidden, 2 * intermediate] with gate
and up interleaved, down_proj [E, intermediate, hidden] and their biases; the router as
mlp.router.weight / bias; self_attn.sinks) and reference_logits.safetensors (`ids`, `logits`
float64 from GptOssForCausalLM in float64, eager attention and experts). The config exercises
every gpt-oss trait: a sliding layer (window 8, shorter than the 40 test positions) and a full
one, attention sinks drawn large enough to take weight, biases on q/k/v/o, YaRN RoPE over 16
original positions without truncation, 4 experts with top 2 and a swiglu_limit of 1.5 that clamps
many gate and up values. Widths are multiples of 128 so `exl3 quantize` converts it without
padding. bf16 keeps the folder near 1 MB; the reference is exact for those values.

It also writes OUT/gpt_oss_mxfp4/: one sliding layer of the same kind whose experts are stored as
OpenAI released gpt-oss, MXFP4 (`*_blocks`, `*_scales`; quantized here: per 32 inputs a power of
two that brings the largest magnitude within 6, then round to nearest e2m1), with
quantization_config naming mxfp4, and its reference from transformers' own dequantization on the
CPU (Mxfp4Config with dequantize on).
"""
import os
import sys

import json

import torch
from safetensors.torch import load_file, save_file
from transformers import GptOssConfig, GptOssForCausalLM, Mxfp4Config

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_deepseek_v3 import write_reference  # noqa: E402


def randomize(model):
    """Weights N(0, 1) / sqrt(fan-in) (the fused experts are input-major, so their fan-in is dim
    1), norms 1 + 0.2 N(0, 1), biases N(0, 0.5^2), sinks N(0, 1.5^2), all rounded to bf16."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            elif name.endswith("sinks"):
                p.copy_(1.5 * torch.randn_like(p))
            elif name.endswith("bias"):
                p.copy_(0.5 * torch.randn_like(p))
            elif name.endswith("experts.gate_up_proj") or name.endswith("experts.down_proj"):
                p.copy_(torch.randn_like(p) / p.shape[1] ** 0.5)
            else:
                p.copy_(torch.randn_like(p) / p.shape[-1] ** 0.5)
            p.copy_(p.to(torch.bfloat16).to(p.dtype))


FP4 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                    -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], dtype=torch.float64)


def to_mxfp4(w):
    """[E, in, columns] input-major -> (blocks U8 [E, columns, in / 32, 16], scales U8
    [E, columns, in / 32]): the layout transformers dequantizes back to [E, in, columns]."""
    e, n, c = w.shape
    x = w.to(torch.float64).transpose(1, 2).reshape(e, c, n // 32, 32)
    amax = x.abs().amax(-1, keepdim=True).clamp_min(2.0 ** -100)
    k = torch.ceil(torch.log2(amax / 6.0))
    q = x / torch.exp2(k)
    idx = (q[..., None] - FP4).abs().argmin(-1)  # nearest e2m1 (the first on a tie)
    packed = (idx[..., 0::2] | (idx[..., 1::2] << 4)).to(torch.uint8)
    return packed, (k[..., 0] + 127).to(torch.uint8)


def write_mxfp4(out, cfg, seed):
    d = os.path.join(out, "gpt_oss_mxfp4")
    torch.manual_seed(seed)
    model = GptOssForCausalLM(cfg)
    randomize(model)
    model.to(torch.bfloat16).save_pretrained(d, safe_serialization=True)
    path = os.path.join(d, "model.safetensors")
    tensors = load_file(path)
    for name in list(tensors):
        if name.endswith("experts.gate_up_proj") or name.endswith("experts.down_proj"):
            blocks, scales = to_mxfp4(tensors.pop(name))
            tensors[name + "_blocks"] = blocks
            tensors[name + "_scales"] = scales
    save_file(tensors, path, metadata={"format": "pt"})
    with open(os.path.join(d, "config.json")) as f:
        config = json.load(f)
    config["quantization_config"] = {
        "quant_method": "mxfp4",
        "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                   "model.embed_tokens", "lm_head"]}
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    write_reference(d, GptOssForCausalLM, cfg.vocab_size, experts_implementation="eager",
                    quantization_config=Mxfp4Config(dequantize=True))


def main():
    d = os.path.join(sys.argv[1], "gpt_oss")
    cfg = GptOssConfig(
        vocab_size=256, hidden_size=128, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, sliding_window=8,
        layer_types=["sliding_attention", "full_attention"], num_local_experts=4,
        num_experts_per_tok=2, swiglu_alpha=1.702, swiglu_limit=1.5, attention_bias=True,
        rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                         "original_max_position_embeddings": 16, "beta_fast": 32.0,
                         "beta_slow": 1.0, "truncate": False},
        max_position_embeddings=64, rms_norm_eps=1e-5, tie_word_embeddings=False,
        bos_token_id=1, eos_token_id=2, pad_token_id=0)
    cfg.architectures = ["GptOssForCausalLM"]
    torch.manual_seed(5000)  # before the model: its init draws from the same stream
    model = GptOssForCausalLM(cfg)
    randomize(model)
    model.to(torch.bfloat16).save_pretrained(d, safe_serialization=True)
    write_reference(d, GptOssForCausalLM, cfg.vocab_size, experts_implementation="eager")
    clamp_share(d, cfg)
    cfg.num_hidden_layers = 1
    cfg.layer_types = ["sliding_attention"]
    write_mxfp4(sys.argv[1], cfg, 5001)


def clamp_share(d, cfg):
    """Prints the share of gate and up values the clamp changes over the reference's ids."""
    model = GptOssForCausalLM.from_pretrained(d, dtype=torch.float64, attn_implementation="eager",
                                              experts_implementation="eager")
    seen = {"gate": [0, 0], "up": [0, 0]}
    for layer in model.model.layers:
        experts = layer.mlp.experts
        original = experts._apply_gate

        def apply_gate(gate_up, original=original, limit=experts.limit):
            gate, up = gate_up[..., ::2], gate_up[..., 1::2]
            seen["gate"][0] += int((gate > limit).sum())
            seen["gate"][1] += gate.numel()
            seen["up"][0] += int((up.abs() > limit).sum())
            seen["up"][1] += up.numel()
            return original(gate_up)

        experts._apply_gate = apply_gate
    ids = torch.tensor([[(i * 37 + 5) % cfg.vocab_size for i in range(40)]])
    with torch.no_grad():
        model(ids)
    for k, (hit, n) in seen.items():
        print(f"{k}: {hit} of {n} values clamped")


if __name__ == "__main__":
    main()
