"""A tiny random DeepSeek-V3 checkpoint with one MTP (multi-token prediction) layer, and an
independent reference of that layer's forward pass.

Run where torch and transformers are installed:  python3 make_deepseek_v3_mtp.py OUT_DIR
It writes OUT_DIR/deepseek_v3_mtp/: config.json (num_hidden_layers 3, num_nextn_predict_layers
1), model.safetensors (fp32; the target's layers 0..2 and the MTP layer stored as layer 3, with
its own shared_head.head and no embed_tokens of its own, so the target's embedding is shared) and
mtp_reference.safetensors:
  ids           int64 [n]           the prompt
  target_logits float64 [n, vocab]  transformers' logits of the target (layers 0..2)
  hidden        float64 [n, hidden] the target's last hidden state after its final norm
  mtp_hidden    float64 [n-1, hidden] the MTP layer's output hidden state at positions 0..n-2
  mtp_logits    float64 [n-1, vocab] its logits (row i predicts ids[i + 2])

The MTP equations, as the serving stacks run DeepSeek's MTP layer (position p of the MTP layer
reads the target's hidden state at p and the embedding of the token at p + 1):
  e_p = enorm(embed(ids[p + 1]))     zeroed before the norm at position 0
  x_p = eh_proj(concat(e_p, hnorm(hidden_p)))         embedding half first
  g   = decoder_block(x)             the same block as a target layer, positions 0..n-2, causal
  mtp_logits = shared_head.head(shared_head.norm(g))
The decoder block is transformers' own DeepseekV3 decoder layer (a 4-layer model's layer 3 with
these weights); the MTP parts around it are numpy in float64.
"""
import os
import sys
import tempfile

import numpy as np
import torch
from safetensors.numpy import save_file
from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_deepseek_v3 import BASE, CASES, weights  # noqa: E402

EXTRA = CASES["deepseek_v3_qlora"]
MTP_ONLY = ("enorm.", "hnorm.", "eh_proj.", "shared_head.")


def rms_norm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def load(d, cfg, tensors):
    """transformers' DeepseekV3ForCausalLM of `cfg` with `tensors`, float64, eager kernels."""
    cfg.save_pretrained(d)
    save_file(tensors, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
    model, info = DeepseekV3ForCausalLM.from_pretrained(
        d, dtype=torch.float64, output_loading_info=True, attn_implementation="eager",
        experts_implementation="eager")
    bad = {key: val for key, val in info.items() if val}
    if bad:
        raise SystemExit(f"{d}: loading info {bad}")
    return model.eval()


def main():
    out = os.path.join(sys.argv[1], "deepseek_v3_mtp")
    os.makedirs(out, exist_ok=True)
    cfg = DeepseekV3Config(**{**BASE, **EXTRA, "num_nextn_predict_layers": 1})
    cfg.architectures = ["DeepseekV3ForCausalLM"]
    h, v, eps = cfg.hidden_size, cfg.vocab_size, cfg.rms_norm_eps
    # Layers 0..3 drawn as a 4-layer model's: layer 3 is the MTP layer's decoder block.
    cfg4 = DeepseekV3Config(**{**BASE, **EXTRA, "num_hidden_layers": 4})
    cfg4.architectures = ["DeepseekV3ForCausalLM"]
    rng = np.random.default_rng(2024)
    w = weights(cfg4, rng)
    p = "model.layers.3."
    w[p + "enorm.weight"] = (1.0 + 0.2 * rng.standard_normal(h)).astype(np.float32)
    w[p + "hnorm.weight"] = (1.0 + 0.2 * rng.standard_normal(h)).astype(np.float32)
    w[p + "eh_proj.weight"] = (rng.standard_normal((h, 2 * h)) / np.sqrt(2 * h)).astype(np.float32)
    w[p + "shared_head.norm.weight"] = (1.0 + 0.2 * rng.standard_normal(h)).astype(np.float32)
    w[p + "shared_head.head.weight"] = (rng.standard_normal((v, h)) / np.sqrt(h)).astype(np.float32)

    cfg.save_pretrained(out)
    save_file(w, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})

    target_w = {k: t for k, t in w.items() if not k.startswith(p)}
    block_w = {k: t for k, t in w.items() if not any(k.startswith(p + m) for m in MTP_ONLY)}
    ids = torch.tensor([(i * 37 + 5) % v for i in range(12)], dtype=torch.int64)
    n = ids.shape[0]
    with tempfile.TemporaryDirectory() as d3, tempfile.TemporaryDirectory() as d4:
        target = load(d3, cfg, target_w)
        four = load(d4, cfg4, block_w)
        with torch.no_grad():
            target_logits = target(ids[None, :]).logits[0].numpy()
            hidden = target.model(ids[None, :]).last_hidden_state[0].numpy()

            f64 = {k: t.astype(np.float64) for k, t in w.items()}
            e = f64["model.embed_tokens.weight"][ids[1:].numpy()]
            e[0] = 0.0  # position 0 of the MTP layer
            x = np.concatenate([rms_norm(e, f64[p + "enorm.weight"], eps),
                                rms_norm(hidden[:-1], f64[p + "hnorm.weight"], eps)], axis=-1)
            x = x @ f64[p + "eh_proj.weight"].T
            m = n - 1
            xt = torch.from_numpy(x)[None]
            pos = torch.arange(m)[None]
            cos_sin = four.model.rotary_emb(xt, pos)
            mask = torch.full((m, m), float("-inf"), dtype=torch.float64).triu(1)[None, None]
            g = four.model.layers[3](xt, attention_mask=mask, position_ids=pos,
                                     position_embeddings=cos_sin)
            g = (g[0] if isinstance(g, tuple) else g)[0].numpy()
    mtp_logits = rms_norm(g, f64[p + "shared_head.norm.weight"], eps) @ f64[
        p + "shared_head.head.weight"].T
    save_file({"ids": ids.numpy(), "target_logits": target_logits, "hidden": hidden,
               "mtp_hidden": g, "mtp_logits": mtp_logits},
              os.path.join(out, "mtp_reference.safetensors"))
    print(out, "mtp argmax", mtp_logits.argmax(-1).tolist(), "next ids", ids[2:].tolist())


if __name__ == "__main__":
    main()
