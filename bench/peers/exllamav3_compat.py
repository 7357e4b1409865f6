#!/usr/bin/env python3
"""exllamav3 compatibility proof for exl3's quantizer (run on the GPU machine).

1. W_hat: for every EXL3 linear of a checkpoint written by `exl3 quantize`, exllamav3's own
   `ext.reconstruct` must give the same fp16 bits as `exl3 dequant` (bit-identical).
2. Encoder: exllamav3's `ext.quantize_tiles` and exl3's encoder (`exl3 encode-tiles`, on the CPU
   and on CUDA) encode the same i.i.d. Gaussian tiles: NMSE per (codebook, K), and tiles/s for
   both, timed in the same run.

exllamav3 is installed from its PyPI package (`pip install --no-deps --target ...`) and its CUDA
extension JIT-builds on first import (TORCH_CUDA_ARCH_LIST=9.0). Writes one JSON report.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import torch
from safetensors.torch import load_file, save_file


def run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"command failed ({r.returncode}): {' '.join(cmd)}\n{r.stdout}\n{r.stderr}")
    return r.stdout


def load_checkpoint(model_dir):
    tensors = {}
    for name in sorted(os.listdir(model_dir)):
        if name.endswith(".safetensors"):
            tensors.update(load_file(os.path.join(model_dir, name)))
    return tensors


def check_w_hat(ext, exl3_bin, model_dir, tmp):
    tensors = load_checkpoint(model_dir)
    prefixes = sorted(n[: -len(".trellis")] for n in tensors if n.endswith(".trellis"))
    results = []
    for p in prefixes:
        trellis = tensors[p + ".trellis"].cuda()
        K = trellis.shape[-1] // 16
        k, n = trellis.shape[0] * 16, trellis.shape[1] * 16
        mcg, mul1 = (p + ".mcg") in tensors, (p + ".mul1") in tensors
        peer = torch.empty((k, n), dtype=torch.half, device="cuda")
        ext.reconstruct(peer, trellis, K, mcg, mul1)
        torch.cuda.synchronize()
        out = os.path.join(tmp, "w.safetensors")
        run([exl3_bin, "dequant", model_dir, "--prefix", p, "--out", out])
        ours = load_file(out)["w_hat"]
        diff = int((ours.view(torch.int16) != peer.cpu().view(torch.int16)).sum())
        results.append({"prefix": p, "K": K, "codebook": "mcg" if mcg else "mul1" if mul1 else "3inst",
                        "shape": [k, n], "mismatched_fp16": diff})
        print(f"  w_hat {p}: K={K} {results[-1]['codebook']} {k}x{n} mismatches={diff}")
    return results


def peer_encode(ext, tiles, K, cb):
    mcg, mul1 = cb == "mcg", cb == "mul1"
    n = tiles.shape[0]
    out_tiles = torch.zeros_like(tiles)
    out_idx = torch.zeros_like(tiles, dtype=torch.short)
    batch = max(256, 2 * torch.cuda.get_device_properties(0).multi_processor_count)
    temp_costs = torch.zeros((batch, 2, 65536 >> K), dtype=torch.half, device="cuda")
    temp_edges = torch.zeros((batch, 256, 65536 >> K), dtype=torch.short, device="cuda")
    # Warm-up on a slice, then time the whole set (exllamav3 batches internally by temp size).
    ext.quantize_tiles(tiles[:batch].contiguous(), out_tiles[:batch], out_idx[:batch], temp_costs, temp_edges, K,
                       mcg, mul1)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for b0 in range(0, n, batch):
        b1 = min(n, b0 + batch)
        ext.quantize_tiles(tiles[b0:b1].contiguous(), out_tiles[b0:b1], out_idx[b0:b1], temp_costs, temp_edges, K,
                           mcg, mul1)
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    return out_tiles, n / dt


def ours_encode(exl3_bin, tiles_cpu, K, cb, device, tmp):
    src = os.path.join(tmp, "tiles.safetensors")
    dst = os.path.join(tmp, "enc.safetensors")
    save_file({"tiles": tiles_cpu.contiguous()}, src)
    out = run([exl3_bin, "encode-tiles", src, "--bits", str(K), "--codebook", cb, "--device", device, "--out", dst,
               "--json"])
    stats = json.loads(out)
    decoded = load_file(dst)["decoded"]
    return decoded, stats["tiles_per_s"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--exl3", required=True, help="path to the exl3 binary")
    ap.add_argument("--model", required=True, help="checkpoint written by `exl3 quantize`")
    ap.add_argument("--tiles", type=int, default=4096)
    ap.add_argument("--cpu-tiles", type=int, default=64, help="tiles for the (slow) CPU encoder timing")
    ap.add_argument("--bits", default="2,3,4,5,6")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    from exllamav3.ext import exllamav3_ext as ext  # JIT-builds the extension on first import

    report = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "w_hat": [], "encoder": []}
    with tempfile.TemporaryDirectory() as tmp:
        print("W_hat: exllamav3 reconstruct vs exl3 dequant")
        report["w_hat"] = check_w_hat(ext, args.exl3, args.model, tmp)
        print("encoder: exllamav3 quantize_tiles vs exl3 encode-tiles")
        g = torch.Generator().manual_seed(args.seed)
        for cb in ("3inst", "mcg", "mul1"):
            scale = 1.0 if cb == "mul1" else 1.24371088
            for K in [int(b) for b in args.bits.split(",")]:
                tiles = torch.randn((args.tiles, 256), generator=g) * scale
                var = float(tiles.var())
                peer_q, peer_tps = peer_encode(ext, tiles.cuda(), K, cb)
                peer_nmse = float(((peer_q.cpu() - tiles) ** 2).mean()) / var
                ours_q, ours_tps = ours_encode(args.exl3, tiles, K, cb, "cuda", tmp)
                ours_nmse = float(((ours_q - tiles) ** 2).mean()) / var
                _, cpu_tps = ours_encode(args.exl3, tiles[: args.cpu_tiles], K, cb, "cpu", tmp)
                row = {"codebook": cb, "K": K, "tiles": args.tiles, "peer_nmse": peer_nmse, "exl3_nmse": ours_nmse,
                       "nmse_ratio": ours_nmse / peer_nmse, "peer_tiles_per_s": peer_tps,
                       "exl3_cuda_tiles_per_s": ours_tps, "exl3_cpu_tiles_per_s": cpu_tps,
                       "speedup_vs_peer": ours_tps / peer_tps}
                report["encoder"].append(row)
                print(f"  {cb:5s} K={K}: NMSE peer {peer_nmse:.5f} exl3 {ours_nmse:.5f} (x{row['nmse_ratio']:.3f}); "
                      f"tiles/s peer {peer_tps:.0f} exl3-cuda {ours_tps:.0f} (x{row['speedup_vs_peer']:.2f}) "
                      f"exl3-cpu {cpu_tps:.0f}")
    bad = [r for r in report["w_hat"] if r["mismatched_fp16"] != 0]
    report["w_hat_bit_identical"] = not bad and len(report["w_hat"]) > 0
    with open(args.out, "w") as f:
        json.dump(report, f, indent=2)
    print(f"W_hat bit-identical for {len(report['w_hat'])} linears: {report['w_hat_bit_identical']}")
    return 0 if report["w_hat_bit_identical"] else 1


if __name__ == "__main__":
    sys.exit(main())
