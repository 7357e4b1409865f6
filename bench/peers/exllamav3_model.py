#!/usr/bin/env python3
"""exllamav3's model-level decode speed on an EXL3 checkpoint (run on the GPU machine), so that
exl3's `bench model` figures have a peer measured in the same run on the same checkpoint.

Two modes per batch size b (random prompt ids, greedy, every sequence decodes exactly N tokens):
  generator  Generator + b Jobs (ArgmaxSampler, stop_conditions=None, max_new_tokens=N), as a user
             runs it. The first iterate() does every job's prefill and its first decode step; the
             clock starts after the iterate() that gave every job its first token and stops when
             the queue is empty, so it covers the last N-1 steps only (no prefill):
             tok/s = b*(N-1)/t. exllamav3's own per-job time_generate (N steps, from just before
             the first decode step) is kept beside it as a cross-check.
  forward    Model.forward in attn_mode "flash_attn" with batch_shape=(b, L) and past_len (the
             batched-cache interface Model.warmup uses): forward of prompt[:-1] untimed, then N
             timed single-token steps, argmax on the GPU and ids back to the host each step (as
             the generator does): tok/s = b*N/t. Skipped for recurrent architectures.
"""
import argparse
import json
import os
import sys
import time

import torch

PAGE = 256  # exllamav3's cache page size (constants.PAGE_SIZE); batch_shape lengths are multiples


def rup(n):
    return -(-n // PAGE) * PAGE


def sync_now():
    torch.cuda.synchronize()
    return time.perf_counter()


def run_forward(model, cache, vocab, b, P, N):
    """One raw run: b rows, prefill P-1 tokens untimed, then N timed decode steps (prompt ids < vocab)."""
    L = rup(P + N)  # positions 0..P+N-2 are written; one cache span of L per row
    ids = torch.randint(0, vocab, (b, P), dtype=torch.long)
    base = {"attn_mode": "flash_attn", "cache": cache, "batch_shape": (b, L)}
    if P > 1:
        # last_tokens_only: we only need the K/V written, not full-prompt logits (as warmup does)
        model.forward(ids[:, :-1], dict(base, past_len=0, last_tokens_only=1))
    cur = ids[:, -1:]
    t0 = sync_now()
    for i in range(N):
        # A fresh params dict each step: prepare_flash_attn writes block_table/cache_seqlens into it
        logits = model.forward(cur, dict(base, past_len=P - 1 + i))
        cur = logits[:, -1:, :model.config.vocab_size].argmax(dim=-1).cpu()
    return sync_now() - t0, N


def run_generator(gen, Job, Sampler, vocab, b, P, N):
    """One generator run: b jobs enqueued together; times the N-1 steps after the first token."""
    # Fresh random prompts each run so no prompt page is served from the page cache
    jobs = [Job(input_ids=torch.randint(0, vocab, (1, P), dtype=torch.long), max_new_tokens=N,
                sampler=Sampler(), stop_conditions=None) for _ in range(b)]
    gen.enqueue(jobs)
    t0, steps, finals = None, 0, []
    while gen.num_remaining_jobs():
        for r in gen.iterate():
            if r.get("stage") == "streaming" and r.get("eos"):
                finals.append(r)
        if t0 is not None:
            steps += 1
        elif all(j.new_tokens >= 1 for j in jobs):
            t0 = sync_now()
    dt = sync_now() - t0
    new = [r["new_tokens"] for r in finals]
    # Every job must have run the full N (no stop token, no cache cap) or the rate means nothing
    if len(finals) != b or any(n != N for n in new) or steps != N - 1:
        raise RuntimeError(f"generator run ended early: jobs={len(finals)}/{b} new_tokens={new} steps={steps}")
    lib_t = max(r["time_generate"] for r in finals)
    return dt, steps, lib_t


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="EXL3 checkpoint directory")
    ap.add_argument("--batch", default="1,8", help="comma-separated batch sizes")
    ap.add_argument("--decode-tokens", type=int, default=128)
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--warmup", type=int, default=1, help="untimed runs per batch size and mode")
    ap.add_argument("--reps", type=int, default=3, help="timed runs per batch size and mode (best kept)")
    ap.add_argument("--cache-tokens", type=int, default=0,
                    help="cache size in tokens (default: max batch * a page-rounded prompt+decode+1 span)")
    ap.add_argument("--modes", default="forward,generator")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    batches = [int(x) for x in a.batch.split(",")]
    modes = a.modes.split(",")
    P, N = a.prompt_tokens, a.decode_tokens
    if N < 2 or P < 1:
        sys.exit("need --decode-tokens >= 2 and --prompt-tokens >= 1")

    try:
        # The first import JIT-builds the CUDA extension (generator imports exllamav3.ext)
        from exllamav3 import Cache, Config, Generator, Job, Model, Tokenizer
        from exllamav3.generator.sampler import ArgmaxSampler
        from exllamav3.constants import PAGE_SIZE
        from exllamav3.version import __version__
    except Exception as e:  # ImportError, or the extension build failing inside the import
        sys.exit(f"exllamav3 is not importable ({type(e).__name__}: {e}); install the .peer wheels "
                 f"(bench/peers/run_model_peer_on_device.sh) and set PYTHONPATH")

    assert PAGE_SIZE == PAGE, f"exllamav3 page size {PAGE_SIZE} != {PAGE}"
    # A job needs ceil((P + N + 1) / PAGE) pages (Job.prepare_for_queue); the forward mode needs
    # b * rup(P + N) tokens. One spare page per row keeps either from the capacity limit.
    cache_tokens = a.cache_tokens or max(batches) * (rup(P + N + 1) + PAGE)
    cache_tokens = rup(cache_tokens)

    torch.manual_seed(0)
    config = Config.from_directory(a.model)
    model = Model.from_config(config)
    cache = Cache(model, max_num_tokens=cache_tokens)  # must exist before load(): load allocates it
    t = time.perf_counter()
    model.load(device=torch.device("cuda:0"))
    print(f"loaded {a.model} in {time.perf_counter() - t:.1f} s, cache {cache_tokens} tokens", flush=True)
    vocab = config.vocab_size
    tokenizer = None
    results = []
    if "generator" in modes and not os.path.exists(os.path.join(a.model, "tokenizer.json")):
        # exl3's synthetic checkpoints have no tokenizer, which exllamav3's Generator needs
        print("  generator mode skipped: the checkpoint has no tokenizer.json", flush=True)
        results.append({"mode": "generator", "skipped": "no tokenizer.json"})
        modes = [m for m in modes if m != "generator"]
    if "generator" in modes:
        tokenizer = Tokenizer.from_config(config)  # needs tokenizer.json in the checkpoint
        vocab = min(vocab, tokenizer.tokenizer.get_vocab_size())

    def record(b, mode, dt, steps, extra=None):
        r = {"batch": b, "mode": mode, "decode_tokens_per_s": b * steps / dt,
             "ms_per_step": dt / steps * 1e3, "timed_steps": steps, **(extra or {})}
        results.append(r)
        print(f"  b={b:<3} {mode:<9} {r['decode_tokens_per_s']:10.1f} tok/s  {r['ms_per_step']:8.3f} ms/step"
              f"  ({steps} steps)" + (f"  {extra}" if extra else ""), flush=True)

    with torch.inference_mode():
        # Forward mode first: the Generator takes ownership of the cache's pages once built
        if "forward" in modes:
            if model.get_recurrent_layers():
                print("  forward mode skipped: recurrent layers need per-row state objects", flush=True)
                results.append({"mode": "forward", "skipped": "recurrent architecture"})
            else:
                for b in batches:
                    for _ in range(a.warmup):
                        run_forward(model, cache, vocab, b, P, N)
                    best = min((run_forward(model, cache, vocab, b, P, N) for _ in range(a.reps)),
                               key=lambda x: x[0])
                    record(b, "forward", *best)
        if "generator" in modes:
            gen = Generator(model=model, cache=cache, tokenizer=tokenizer, max_batch_size=max(batches))
            for b in batches:
                for _ in range(a.warmup):
                    run_generator(gen, Job, ArgmaxSampler, vocab, b, P, N)
                dt, steps, lib_t = min((run_generator(gen, Job, ArgmaxSampler, vocab, b, P, N)
                                        for _ in range(a.reps)), key=lambda x: x[0])
                record(b, "generator", dt, steps,
                       {"lib_time_generate_s": lib_t, "lib_decode_tokens_per_s": b * N / lib_t})

    report = {"peer": "exllamav3", "version": __version__, "model": a.model,
              "gpu": torch.cuda.get_device_name(), "prompt_tokens": P, "decode_tokens": N,
              "cache_tokens": cache_tokens, "results": results, "command": " ".join(sys.argv)}
    with open(a.out, "w") as f:
        json.dump(report, f, indent=1)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
