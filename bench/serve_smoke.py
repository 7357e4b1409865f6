#!/usr/bin/env python3
"""Smoke test of a running `exl3 serve` (e.g. on the GPU machine with --device cuda): one greedy
completion, the same prompt as 8 concurrent streams (each must equal the solo text: batching must
not change greedy output), a chat completion, 8 concurrent structured-output requests (a JSON
schema: each reply must parse and fit it), and /health. Prints JSON; exits 1 on a mismatch.

  exl3 serve MODEL --device cuda --port 8123 & python3 bench/serve_smoke.py --port 8123
"""
import argparse
import concurrent.futures
import json
import sys
import time
import urllib.error
import urllib.request


def post(port, path, body, timeout=60):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.read().decode()


def stream_text(port, prompt, n):
    raw = post(port, "/v1/completions", {"prompt": prompt, "max_tokens": n, "temperature": 0, "stream": True})
    text = ""
    for line in raw.splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            text += json.loads(line[6:])["choices"][0].get("text", "")
    return text


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=8123)
    ap.add_argument("--tokens", type=int, default=24)
    args = ap.parse_args()
    for _ in range(120):  # wait for the server
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{args.port}/health", timeout=2)
            break
        except Exception:
            time.sleep(0.5)
    prompts = [f"Story {i}: once upon a time" for i in range(8)]
    solo = [json.loads(post(args.port, "/v1/completions",
                            {"prompt": p, "max_tokens": args.tokens, "temperature": 0}))["choices"][0]["text"]
            for p in prompts]
    t0 = time.time()
    with concurrent.futures.ThreadPoolExecutor(8) as ex:
        streamed = list(ex.map(lambda p: stream_text(args.port, p, args.tokens), prompts))
    secs = time.time() - t0
    try:  # a model without a chat template answers 400, which counts as a valid answer here
        chat = json.loads(post(args.port, "/v1/chat/completions",
                               {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}))
        chat_result = chat["choices"][0]["finish_reason"]
    except urllib.error.HTTPError as e:
        chat_result = f"HTTP {e.code}: {e.read().decode()[:200]}"
    # Structured output: a short, bounded schema (a boolean and an integer of at most 16 digits), so
    # every reply ends within max_tokens; greedy and seeded sampling side by side.
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer"}},
              "required": ["ok", "n"]}

    def structured(i):
        body = {"prompt": prompts[i], "max_tokens": 96, "temperature": 0 if i % 2 == 0 else 1.0,
                "seed": i, "response_format": {"type": "json_schema",
                                               "json_schema": {"name": "r", "schema": schema}}}
        choice = json.loads(post(args.port, "/v1/completions", body))["choices"][0]
        try:
            v = json.loads(choice["text"])
            fits = (isinstance(v, dict) and set(v) == {"ok", "n"} and isinstance(v["ok"], bool)
                    and isinstance(v["n"], int) and not isinstance(v["n"], bool))
        except ValueError:
            fits = False
        return {"finish_reason": choice["finish_reason"], "fits": fits, "text": choice["text"][:80]}

    with concurrent.futures.ThreadPoolExecutor(8) as ex:
        shaped = list(ex.map(structured, range(8)))
    health = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{args.port}/health", timeout=5).read())
    same = [a == b for a, b in zip(solo, streamed)]
    fits = all(r["fits"] and r["finish_reason"] == "stop" for r in shaped)
    print(json.dumps({"concurrent_streams_equal_solo": same, "concurrent_seconds": secs,
                      "chat": chat_result, "structured": shaped, "health": health}, indent=1))
    return 0 if all(same) and fits else 1


if __name__ == "__main__":
    sys.exit(main())
