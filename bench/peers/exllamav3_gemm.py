#!/usr/bin/env python3
"""exllamav3's EXL3 linear (LinearEXL3.forward) timed on the same shapes, bit widths and row counts
as `exl3_bench_gemm`, with the same method: random trellis weight sets rotated through >= 512 MiB
(so the weights come from HBM, not L2), each call captured in a CUDA graph, and back-to-back
replays timed with CUDA events.

Run on the GPU machine (exllamav3 JIT-builds its extension on first import):
  EXL3_INT8_GEMV=0 python3 bench/peers/exllamav3_gemm.py --out a.json   # exact fp16 path
  python3 bench/peers/exllamav3_gemm.py --out b.json                    # its default (int8 GEMV)
"""
import argparse
import json
import os
import statistics

import torch


def parse_list(s):
    return [int(v) for v in s.split(",") if v]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="4096x4096,6144x2048,2048x6144,8192x28672")
    ap.add_argument("--bits", default="2,3,4,5,6,8")
    ap.add_argument("--m", default="1,2,4,8,16,32,64,128,256,1024,4096")
    ap.add_argument("--codebook", default="mcg", choices=["3inst", "mcg", "mul1"])
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    from exllamav3.modules.quant.exl3 import LinearEXL3

    torch.backends.cuda.matmul.allow_tf32 = False
    dev = torch.device("cuda:0")
    g = torch.Generator(device="cpu").manual_seed(0)
    cases = []
    for shape in args.shapes.split(","):
        k, n = (int(v) for v in shape.split("x"))
        for K in parse_list(args.bits):
            tbytes = (k // 16) * (n // 16) * 16 * K * 2
            nb = max(2, min(16, (512 << 20) // tbytes + 1))
            layers = []
            for _ in range(nb):
                trellis = torch.randint(-32768, 32767, (k // 16, n // 16, 16 * K), dtype=torch.int16, generator=g)
                sign = lambda size: torch.where(torch.rand(size, generator=g) < 0.5, -1.0, 1.0)
                suh = (sign(k) * (0.05 + 0.95 * torch.rand(k, generator=g))).half()
                svh = (sign(n) * (0.05 + 0.95 * torch.rand(n, generator=g))).half()
                marker = {}
                if args.codebook == "mcg":
                    marker["mcg"] = torch.tensor(-877912083, dtype=torch.int32, device=dev)
                elif args.codebook == "mul1":
                    marker["mul1"] = torch.tensor(-2082680531, dtype=torch.int32, device=dev)
                layers.append(LinearEXL3(None, k, n, suh=suh.to(dev), svh=svh.to(dev), trellis=trellis.to(dev),
                                         **marker))
            for m in parse_list(args.m):
                x = torch.randn(m, k, generator=g).half().to(dev)
                # Warm up (autotune, lazy allocations) outside capture, then one graph per set.
                for L in layers:
                    L.forward(x, {})
                torch.cuda.synchronize()
                graphs = []
                try:
                    for L in layers:
                        gr = torch.cuda.CUDAGraph()
                        with torch.cuda.graph(gr):
                            L.forward(x, {})
                        graphs.append(gr)
                    run = lambda i: graphs[i % nb].replay()
                    mode = "graph"
                except Exception as e:  # report how it was timed rather than failing the sweep
                    torch.cuda.synchronize()
                    run = lambda i: layers[i % nb].forward(x, {})
                    mode = f"eager ({type(e).__name__})"
                for i in range(2 * nb):
                    run(i)
                times = []
                for r in range(args.reps):
                    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    s.record()
                    for i in range(nb):
                        run(i)
                    e.record()
                    e.synchronize()
                    times.append(s.elapsed_time(e) * 1000.0 / nb)
                us = statistics.median(times)
                print(f"{k:>5}x{n:<5} K={K} m={m:<5} {us:9.1f} us  [{mode}]", flush=True)
                cases.append({"k": k, "n": n, "bits": K, "m": m, "us": us, "mode": mode, "weight_sets": nb})
                del graphs
            del layers
            torch.cuda.empty_cache()
    out = {"peer": "exllamav3", "codebook": args.codebook, "device": torch.cuda.get_device_name(0),
           "env_EXL3_INT8_GEMV": os.environ.get("EXL3_INT8_GEMV", "(default)"), "reps": args.reps, "cases": cases}
    with open(args.out, "w") as f:
        json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
