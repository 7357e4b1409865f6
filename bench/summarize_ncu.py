#!/usr/bin/env python3
"""Summarize an Nsight Compute CSV of `exl3 bench model` decode steps (bench/profile_decode_on_device.sh).

The last decode step is the last `per_step` kernels of the file: the step's kernel sequence is found as
the period of the trailing kernel-name sequence. Prints each kernel of one step grouped by name (count,
total us) and the step's kernel count and summed kernel time.
Usage: summarize_ncu.py NCU.csv [LAYERS]
"""
import csv
import re
import sys
from collections import OrderedDict


def load(path):
    rows = [r for r in csv.reader(open(path)) if len(r) > 10]
    hdr, rows = rows[0], rows[1:]
    k, v = hdr.index("Kernel Name"), hdr.index("Metric Value")
    return [(re.sub(r"\(.*", "", r[k]).replace("exl3::", ""), float(r[v].replace(",", "")) / 1e3) for r in rows]


def step_period(names):
    # Smallest p such that the last 2p names repeat with period p.
    for p in range(8, len(names) // 2):
        if names[-p:] == names[-2 * p:-p]:
            return p
    raise SystemExit("no repeating decode step found")


def main():
    kernels = load(sys.argv[1])
    layers = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    names = [n for n, _ in kernels]
    p = step_period(names)
    step = kernels[-p:]
    groups = OrderedDict()
    for n, t in step:
        c, s = groups.get(n, (0, 0.0))
        groups[n] = (c + 1, s + t)
    total = sum(t for _, t in step)
    print(f"one decode step: {p} kernels, {total:.1f} us of kernel time")
    if layers:
        print(f"per layer (excluding head/embed): ~{p / layers:.1f} kernels")
    for n, (c, s) in sorted(groups.items(), key=lambda x: -x[1][1]):
        print(f"{s:9.1f} us {100 * s / total:5.1f}%  x{c:<4d} {s / c:7.2f} us  {n[:100]}")


if __name__ == "__main__":
    main()
