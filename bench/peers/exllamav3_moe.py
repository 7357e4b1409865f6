#!/usr/bin/env python3
"""exllamav3's block-sparse MoE layer (BlockSparseMLP.forward and the kernels it calls), timed on one
layer of random EXL3 experts with the method described below: GLM-5.2 per-rank geometry
(H=6144, I=512, E=256, top-8) or Qwen3-30B-A3B (H=2048, I=768, E=128, top-8), random trellis, each
token a uniformly random top-8 with random positive weights normalised per token, each timed rep on
one of 16 pre-drawn routings (and one of 4 activation buffers). The router GEMM and top-k are not
timed: the routing is injected in place of BlockSparseMLP's routing function.

What runs (exllamav3 1.4.1, read from its source):
  * The layer is a real `BlockSparseMLP` (config=None, interm_dtype=half, out_dtype=float, silu,
    as the MoE architectures build it; routed experts only, no shared experts) over real `Linear`
    objects whose `.inner` is a `LinearEXL3`, made ready by its own `load_local()` (MultiLinear
    pointer tables, `ext.BC_BlockSparseMLP`, the exl3_moe buffers). 'layer' = `BlockSparseMLP.forward(x, params)`,
    which picks the path itself:
      - m <= MAX_BSZN (8): `BC_BlockSparseMLP.run_bszN(y, selected_experts, routing_weights)`,
        replayed as a CUDA graph from the second call on (exl3_mgemm gate, exl3_mgemm up,
        silu_mul, exl3_mgemm down with the routing-weighted reduction; m > 1 gathers the m*8
        slots with index_select first, eagerly);
      - m >= f_threshold (= min(E/8, 4)) and not bszN: zeros, argsort, gathers, bincount,
        `.tolist()` (host sync), then the fused `ext.exl3_moe` (mcg/mul1 only), then the
        per-expert fallback (BC run_single_expert / run_single_expert_dq) for experts with more
        than TEMP_ROWS_FUSED (128) rows.
    The path actually taken is read by counting the calls of one untimed forward.
  * 'kernel' = the kernel alone: `ext.exl3_moe` with the routing prepared beforehand (fused path),
    or, for the bszN path, the same exl3_mgemm / silu_mul / exl3_mgemm sequence issued eagerly
    (as the earlier peer measurement did; bench/results/README.md, History).
  * Mixed --bits (e.g. 3:148,4:108): exllamav3 cannot run per-expert K in one call (exl3_mgemm
    takes one `int K`; exl3_moe takes one K per projection; MultiLinear asserts a uniform K over
    the experts). Each tier is then an expert-range shard (routing_first/routing_last, exllamav3's
    own expert-parallel mechanism), timed one after the other; the layer figure is the
    sequential sum. See the JSON notes.
  * Correctness: at --check-m, rel-L2 of the layer (and kernel) output against an fp32 reference
    built from exllamav3's own `reconstruct` (LinearEXL3.get_inner_weight_tensor) plus its
    Hadamard/sign formula (LinearEXL3.get_weight_tensor, done in fp32), with silu(g)*u rounded
    to fp16.

Timing: CUDA events around each call; before each rep a GPU spin (torch.cuda._sleep, --spin-us)
lets the host enqueue the call ahead of the GPU, so the median is GPU time without launch gaps
(the fused path's host sync is still inside 'layer', as in production). Median (min, p90 kept).
'MB touched' = mean distinct experts x (gate+up+down trellis + suh/svh) + x (fp16) + out (fp32).

Run on the GPU machine (exllamav3 JIT-builds its extension on first import, ~160 s; build it in
its own call first so the benchmark call stays inside the 600 s limit):
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .peer/*.whl
  PYTHONPATH=/tmp/site TORCH_CUDA_ARCH_LIST=9.0 MAX_JOBS=16 python3 -c "import exllamav3.ext"
  PYTHONPATH=/tmp/site TORCH_CUDA_ARCH_LIST=9.0 python3 bench/peers/exllamav3_moe.py --geometry glm52 --codebook mcg --out $OUT/moe_glm52_mcg.json
  PYTHONPATH=/tmp/site TORCH_CUDA_ARCH_LIST=9.0 python3 bench/peers/exllamav3_moe.py --geometry glm52 --codebook mul1 --out $OUT/moe_glm52_mul1.json
  PYTHONPATH=/tmp/site TORCH_CUDA_ARCH_LIST=9.0 python3 bench/peers/exllamav3_moe.py --geometry glm52 --bits 3:148,4:108 --out $OUT/moe_glm52_mixed.json
  PYTHONPATH=/tmp/site TORCH_CUDA_ARCH_LIST=9.0 python3 bench/peers/exllamav3_moe.py --geometry qwen3-30b-a3b --out $OUT/moe_qwen3.json
"""
import argparse
import json
import math
import statistics
import sys

try:
    import torch
except ImportError:  # the pure-Python helpers stay importable (and checkable) off the GPU machine
    torch = None

GEOMETRIES = {
    "glm52": {"H": 6144, "I": 512, "E": 256, "topk": 8},
    "qwen3-30b-a3b": {"H": 2048, "I": 768, "E": 128, "topk": 8},
}
MCG_MARKER = -877912083     # 0xCBAC1FED as int32 (exllamav3 quantize.py codebook_mcg_mult)
MUL1_MARKER = -2082680531   # 0x83DCD12D as int32 (codebook_mul1_mult)

SIGNATURES = [
    "BlockSparseMLP.forward(x, params, out_dtype=None)  [exllamav3/modules/block_sparse_mlp.py]",
    "BC_BlockSparseMLP.run_bszN(y, selected_experts, routing_weights)  [libtorch/blocksparse_mlp.cpp; graph per bsz 1..8]",
    "exl3_mgemm(A, B_ptrs, C, suh_ptrs, A_had, svh_ptrs, indices?, weights?, int K, int force_shape_idx, "
    "uint32 mcg, uint32 mul1, int min_index, int max_index, int force_num_sms, int num_tokens, size_n_list?, c_ptrs?) -> int",
    "silu_mul(x, y, z, float act_limit)",
    "exl3_moe(hidden_state, output_state, expert_count, token_sorted, weight_sorted, temp_state_g, temp_state_u, "
    "temp_intermediate_g, temp_intermediate_u, int act_function, int K_gate, int K_up, int K_down, "
    "gate_ptrs_trellis, gate_ptrs_suh, gate_ptrs_svh, up_ptrs_trellis, up_ptrs_suh, up_ptrs_svh, "
    "down_ptrs_trellis, down_ptrs_suh, down_ptrs_svh, bool gate_mcg, bool gate_mul1, bool up_mcg, bool up_mul1, "
    "bool down_mcg, bool down_mul1, float act_limit, int num_active) -> None",
    "exl3_moe_max_concurrency(int device) -> int",
    "reconstruct(unpacked_fp16[k,n], packed_trellis, int K, bool mcg, bool mul1)",
]


# ---------------------------------------------------------------- pure-Python helpers

def parse_list(s):
    return [int(v) for v in s.split(",") if v.strip()]


def parse_bits(spec, num_experts):
    """'3' -> [(3, 0, E)]; '3:148,4:108' -> [(3, 0, 148), (4, 148, 256)] (K, first, last)."""
    spec = spec.strip()
    if ":" not in spec:
        K = int(spec)
        if not 1 <= K <= 8:
            raise ValueError(f"K={K} out of range 1..8")
        return [(K, 0, num_experts)]
    tiers, first = [], 0
    for part in spec.split(","):
        k_s, n_s = part.split(":")
        K, n = int(k_s), int(n_s)
        if not 1 <= K <= 8 or n <= 0:
            raise ValueError(f"bad tier {part!r}")
        tiers.append((K, first, first + n))
        first += n
    if first != num_experts:
        raise ValueError(f"--bits {spec!r} covers {first} experts, the geometry has {num_experts}")
    return tiers


def expert_bytes(H, I, K):
    """gate + up + down trellis (K bits per weight) + suh/svh (fp16) of one expert."""
    return 3 * H * I * K // 8 + 2 * 3 * (H + I)


def case_bytes(distinct_per_tier, tiers, H, I, m):
    """Bytes touched: mean distinct experts per tier x their bytes + x (fp16) + out (fp32)."""
    w = sum(d * expert_bytes(H, I, K) for d, (K, _, _) in zip(distinct_per_tier, tiers))
    return w + m * H * 2 + m * H * 4


def case_flops(m, topk, H, I):
    return 2.0 * m * topk * 3 * H * I


def path_label(calls):
    """Short label for the calls one forward made (keys as counted by CallCounter)."""
    if calls.get("bc.run_bszN"):
        return "bszN"
    fallback = calls.get("bc.run_single_expert", 0) + calls.get("bc.run_single_expert_dq", 0)
    if calls.get("exl3_moe"):
        return f"fused+fallback({fallback})" if fallback else "fused"
    if fallback:
        return f"expert-loop({fallback})"
    if calls.get("exl3_mgemm"):
        return "mgemm-loop"
    return "none"


PATH_DESCRIPTIONS = {
    "bszN": "BC_BlockSparseMLP.run_bszN: CUDA graph of exl3_mgemm gate, exl3_mgemm up, silu_mul, "
            "exl3_mgemm down with routing-weighted reduction (m > 1: eager index_select gather first)",
    "fused": "zeros, argsort, gathers, bincount, .tolist() (host sync), ext.exl3_moe",
    "fused+fallback": "as fused, plus BC run_single_expert(_dq) for experts with > TEMP_ROWS_FUSED rows",
    "expert-loop": "per-expert loop: BC run_single_expert (<= 32 rows) / run_single_expert_dq (no fused kernel, e.g. 3inst)",
    "mgemm-loop": "per-token exl3_mgemm loop (expert-range shard at 1 < m < f_threshold)",
}


def summarize(times):
    s = sorted(times)
    p90 = s[min(len(s) - 1, int(math.ceil(0.9 * len(s))) - 1)]
    return {"median": statistics.median(s), "min": s[0], "p90": p90}


def rel_l2(y, ref):
    return float((y.double() - ref.double()).norm() / ref.double().norm().clamp_min(1e-30))


# ---------------------------------------------------------------- exllamav3 objects

class CallCounter:
    """Proxy that counts calls to a target's callables (the ext module, a BC object)."""

    def __init__(self, target, prefix, counts):
        object.__setattr__(self, "_t", target)
        object.__setattr__(self, "_p", prefix)
        object.__setattr__(self, "_c", counts)

    def __getattr__(self, name):
        attr = getattr(self._t, name)
        if not callable(attr):
            return attr
        counts, key = self._c, self._p + name

        def wrapped(*a, **k):
            counts[key] = counts.get(key, 0) + 1
            return attr(*a, **k)
        return wrapped


class NoBackend:
    """params['backend'] for expert-range shards: forward() broadcasts the routing from
    routing_device; on one GPU with injected routing there is nothing to broadcast."""

    def broadcast(self, *a, **k):
        pass

    def all_reduce(self, *a, **k):
        raise RuntimeError("unexpected all_reduce")


class Routing:
    sel = None
    w = None


class Shard:
    pass


def build_shard(ev, geo, K, first, last, codebook, dev, gen, routing, sharded, tag):
    from exllamav3.modules.linear import Linear
    from exllamav3.modules.quant.exl3 import LinearEXL3
    from exllamav3.modules.block_sparse_mlp import BlockSparseMLP

    H, I, E, topk = geo["H"], geo["I"], geo["E"], geo["topk"]
    n_exp = last - first

    def marker():
        if codebook == "mcg":
            return {"mcg": torch.tensor(MCG_MARKER, dtype=torch.int32, device=dev)}
        if codebook == "mul1":
            return {"mul1": torch.tensor(MUL1_MARKER, dtype=torch.int32, device=dev)}
        return {}

    def scales(n):
        sign = torch.where(torch.rand(n_exp, n, generator=gen, device=dev) < 0.5, -1.0, 1.0)
        return (sign * (0.05 + 0.95 * torch.rand(n_exp, n, generator=gen, device=dev))).half()

    def make(kind, k, n, out_dtype):
        # One contiguous block per projection; every int16 pattern is a valid trellis.
        trellis = torch.randint(-32768, 32767, (n_exp, k // 16, n // 16, 16 * K), dtype=torch.int16,
                                generator=gen, device=dev)
        suh, svh = scales(k), scales(n)
        lins = []
        for e in range(n_exp):
            extra = {"allow_input_padding": True, "trim_padded_out": True} if kind == "down" else {}
            lin = Linear(None, f"{tag}.experts.{first + e}.{kind}_proj", k, n, out_dtype=out_dtype, **extra)
            lin.device = dev
            lin.inner = LinearEXL3(None, k, n, suh=suh[e], svh=svh[e], trellis=trellis[e], out_dtype=out_dtype,
                                   key=lin.key, **marker())
            lin.quant_type = "exl3"
            lins.append(lin)
        return lins

    gates = make("gate", H, I, torch.half)
    ups = make("up", H, I, torch.half)
    downs = make("down", I, H, torch.float)

    kw = {}
    if sharded:
        kw = dict(num_local_experts=n_exp, routing_first=first, routing_last=last, routing_device=0)
    mlp = BlockSparseMLP(None, tag, H, I, E, topk, gates=gates, ups=ups, downs=downs,
                         interm_dtype=torch.half, out_dtype=torch.float, activation_fn="silu", **kw)
    mlp.device = dev
    mlp.load_local()
    # Routing injection: forward() calls self.routing_fn only when a routing gate exists.
    mlp.routing_gate = object()
    mlp.routing_fn = lambda bsz, cfg, z, params: (routing.sel, routing.w)

    sh = Shard()
    sh.mlp, sh.K, sh.first, sh.last, sh.n_exp, sh.sharded = mlp, K, first, last, n_exp, sharded
    sh.params = {"backend": NoBackend()} if sharded else {}
    sh.gates, sh.ups, sh.downs = gates, ups, downs
    sh.fused = mlp.fused_mode_buffers is not None
    cfg = mlp.experts_cfg
    sh.min_e, sh.max_e = cfg.min_expert, cfg.max_expert
    return sh


def probe_calls(ev, bsm, sh, x):
    counts = {}
    ext_saved, bc_saved = bsm.ext, sh.mlp.bc
    bsm.ext = CallCounter(ext_saved, "", counts)
    if bc_saved is not None:
        sh.mlp.bc = CallCounter(bc_saved, "bc.", counts)
    try:
        sh.mlp.forward(x, sh.params)
    finally:
        bsm.ext, sh.mlp.bc = ext_saved, bc_saved
    torch.cuda.synchronize()
    return counts


def prep_fused(sh, sel, w, temp_rows):
    """What forward() computes before exl3_moe, done ahead of time (kernel-only timing)."""
    m, topk = sel.shape
    flat_e = sel.reshape(-1)
    flat_w = w.reshape(-1)
    flat_tok = torch.arange(m, device=sel.device).repeat_interleave(topk)
    if sh.sharded:
        loc = flat_e - sh.first
        valid = (loc >= 0) & (loc < sh.n_exp)
        loc = torch.where(valid, loc, torch.full_like(loc, sh.n_exp))
    else:
        loc = flat_e
    order = loc.argsort()
    count = torch.bincount(loc, minlength=sh.n_exp + 1)
    cl = count.tolist()[:sh.n_exp]
    return {"count": count, "tok": flat_tok[order].contiguous(), "w": flat_w[order].contiguous(),
            "num_active": sum(1 for c in cl if 0 < c <= temp_rows),
            "overflow": sum(1 for c in cl if c > temp_rows), "max_rows": max(cl)}


def run_exl3_moe(ev, sh, y, out, p):
    mlp, fb = sh.mlp, sh.mlp.fused_mode_buffers
    g, u, d = mlp.multi_gate, mlp.multi_up, mlp.multi_down
    ev.exl3_moe(y, out, p["count"], p["tok"], p["w"],
                fb.temp_state_g, fb.temp_state_u, fb.temp_intermediate_g, fb.temp_intermediate_u,
                mlp.activation_fn_idx, g.K, u.K, d.K,
                g.ptrs_trellis, g.ptrs_suh, g.ptrs_svh,
                u.ptrs_trellis, u.ptrs_suh, u.ptrs_svh,
                d.ptrs_trellis, d.ptrs_suh, d.ptrs_svh,
                g.mcg, g.mul1, u.mcg, u.mul1, d.mcg, d.mul1,
                mlp.act_limit, p["num_active"])


class EagerBufs:
    def __init__(self, geo, dev):
        H, I, rows = geo["H"], geo["I"], 8 * geo["topk"]
        self.a_gather = torch.empty((rows, H), dtype=torch.half, device=dev)
        self.yh = torch.empty((rows, 1, H), dtype=torch.half, device=dev)
        self.ig = torch.empty((rows, 1, I), dtype=torch.half, device=dev)
        self.iu = torch.empty((rows, 1, I), dtype=torch.half, device=dev)
        self.ia = torch.empty((rows, 1, I), dtype=torch.half, device=dev)
        self.out = torch.empty((rows, 1, H), dtype=torch.float, device=dev)
        self.flat_tok = {}


def bszn_eager(ev, sh, y, sel, w, b):
    """BC_BlockSparseMLP::run_bszN(_gr)'s sequence, issued eagerly through the Python bindings."""
    m, numex = sel.shape
    bszm = m * numex
    mlp = sh.mlp
    g, u, d = mlp.multi_gate, mlp.multi_up, mlp.multi_down
    if m == 1:
        yi = y.unsqueeze(0)                                  # [1, 1, H]: the bszm_in == 1 broadcast
    else:
        ft = b.flat_tok.get(m)
        if ft is None:
            ft = b.flat_tok[m] = torch.arange(m, device=y.device).repeat_interleave(numex)
        b.a_gather[:bszm].copy_(y.index_select(0, ft))
        yi = b.a_gather[:bszm].view(bszm, 1, y.shape[1])
    si, wi = sel.reshape(1, -1), w.reshape(1, -1)
    ig, iu, ia, yh, out = b.ig[:bszm], b.iu[:bszm], b.ia[:bszm], b.yh[:bszm], b.out[:bszm]
    ev.exl3_mgemm(yi, g.ptrs_trellis, ig, g.ptrs_suh, yh, g.ptrs_svh, si, None, g.K, -1, g.mcg, g.mul1,
                  sh.min_e, sh.max_e, 0, m, None, None)
    ev.exl3_mgemm(yi, u.ptrs_trellis, iu, u.ptrs_suh, yh, u.ptrs_svh, si, None, u.K, -1, u.mcg, u.mul1,
                  sh.min_e, sh.max_e, 0, m, None, None)
    ev.silu_mul(ig, iu, ia, mlp.act_limit)
    # A_had for down must not alias A: the gate buffer is free after the activation (as in run_bszN_gr)
    ev.exl3_mgemm(ia, d.ptrs_trellis, out, d.ptrs_suh, ig, d.ptrs_svh, si, wi, d.K, -1, d.mcg, d.mul1,
                  sh.min_e, sh.max_e, 0, m, None, None)
    return out[:m, 0]


def weight_fp32(lin):
    """exllamav3's LinearEXL3.get_weight_tensor() formula, kept in fp32: reconstruct -> had_l ->
    * suh (rows) -> had_r -> * svh (cols)."""
    from exllamav3.modules.quant.exl3_lib.quantize import preapply_had_l, preapply_had_r, had_k, had_n
    inner = lin.inner
    w = inner.get_inner_weight_tensor().float()              # ext.reconstruct(w, trellis, K, mcg, mul1)
    w = preapply_had_l(w, had_k)
    w *= inner.suh.float().unsqueeze(1)
    w = preapply_had_r(w, had_n)
    w *= inner.svh.float().unsqueeze(0)
    return w


def reference(shards, x, sel, w):
    xf = x.float()
    ref = torch.zeros(x.shape, dtype=torch.float, device=x.device)
    present = torch.unique(sel).tolist()
    for sh in shards:
        for e in present:
            if not sh.first <= e < sh.last:
                continue
            le = e - sh.first
            rows, slots = (sel == e).nonzero(as_tuple=True)
            g = xf[rows] @ weight_fp32(sh.gates[le])
            u = xf[rows] @ weight_fp32(sh.ups[le])
            a = (torch.nn.functional.silu(g) * u).half().float()
            o = (a @ weight_fp32(sh.downs[le])) * w[rows, slots].float().unsqueeze(1)
            ref.index_add_(0, rows, o)
    return ref


def make_routing(m, E, topk, gen, dev):
    sel = torch.rand(m, E, generator=gen, device=dev).topk(topk, dim=-1).indices.contiguous()
    wt = 0.05 + 0.95 * torch.rand(m, topk, generator=gen, device=dev)
    wt = (wt / wt.sum(dim=-1, keepdim=True)).half().contiguous()
    return sel.to(torch.long), wt


def spin_cycles_per_us():
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(100000)
    torch.cuda.synchronize()
    n = 4_000_000
    s.record()
    torch.cuda._sleep(n)
    e.record()
    e.synchronize()
    return n / (s.elapsed_time(e) * 1000.0)


def time_gpu(fn, reps, warm, spin_cycles, pre=None):
    for i in range(warm):
        if pre:
            pre(i)
        fn(i)
    torch.cuda.synchronize()
    times = []
    for r in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        if spin_cycles:
            torch.cuda._sleep(spin_cycles)
        if pre:
            pre(r)
        s.record()
        fn(r)
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) * 1000.0)
    return summarize(times)


# ---------------------------------------------------------------- main

def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--geometry", default="glm52", choices=sorted(GEOMETRIES))
    ap.add_argument("--bits", default="3", help="K for every expert, or tiers 'K:count,...' in expert order")
    ap.add_argument("--codebook", default="mcg", choices=["mcg", "mul1", "3inst"])
    ap.add_argument("--m", default="1,2,4,8,16,32,64,256,1024,3072")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--routings", type=int, default=16, help="pre-drawn routings per m, rotated over reps")
    ap.add_argument("--xbufs", type=int, default=4, help="activation buffers per m, rotated over reps")
    ap.add_argument("--warmup", type=int, default=0, help="warm-up calls (default: routings + 2)")
    ap.add_argument("--spin-us", type=float, default=150.0, help="GPU spin before each timed rep (0: none)")
    ap.add_argument("--check-m", default="1,8,64,1024", help="m values (of --m) checked against fp32")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    if torch is None:
        sys.exit("torch is required")
    import exllamav3
    from exllamav3.ext import exllamav3_ext as ev
    import exllamav3.modules.block_sparse_mlp as bsm
    version = getattr(exllamav3, "__version__", None)
    if version is None:
        from exllamav3.version import __version__ as version

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = torch.device("cuda:0")
    torch.cuda.set_device(dev)
    gen = torch.Generator(device=dev).manual_seed(args.seed)

    geo = GEOMETRIES[args.geometry]
    H, I, E, topk = geo["H"], geo["I"], geo["E"], geo["topk"]
    tiers = parse_bits(args.bits, E)
    mixed = len(tiers) > 1
    temp_rows = bsm.TEMP_ROWS_FUSED
    notes = [
        f"exllamav3 {version}: layer = BlockSparseMLP.forward on a real module (config=None, interm_dtype=half, "
        f"out_dtype=float, silu) over Linear/LinearEXL3 experts prepared by BlockSparseMLP.load_local(); routing "
        f"injected via routing_fn (router GEMM and top-k not timed).",
        f"Path thresholds read from the module: MAX_BSZN={bsm.MAX_BSZN}, TEMP_ROWS_FUSED={temp_rows}, "
        f"TEMP_ROWS_GRAPH={bsm.TEMP_ROWS_GRAPH}; each case's path is read by counting the calls of one untimed forward.",
        "kernel (fused) = ext.exl3_moe alone with expert_count/token_sorted/weight_sorted/num_active prepared "
        "beforehand and the fp32 output zeroed outside the timed window; it excludes the per-expert fallback for "
        "experts over TEMP_ROWS_FUSED rows (see experts_over_temp_rows).",
        "kernel (bszN) = exl3_mgemm gate, exl3_mgemm up, silu_mul, exl3_mgemm down (+weighted reduction) issued "
        "eagerly (m > 1: index_select gather first), i.e. run_bszN's sequence without the CUDA graph; "
        "layer at m <= 8 is run_bszN itself (graph replay from the 2nd call).",
        "Timing: CUDA events, median over reps; a GPU spin (torch.cuda._sleep) before each rep so the host "
        "enqueues ahead of the GPU. The fused path's .tolist() host sync remains inside 'layer'.",
        "HBM: the layer's experts (layer_mb) are far larger than L2 (60 MiB on H200) and every rep uses a "
        "different routing (and activation buffer) than the rep before it, so expert weights come from HBM.",
        "MB touched = mean distinct experts x (3 trellis + suh/svh fp16) + x fp16 + out fp32; GB/s = 1e9 B/s.",
        "rel-L2: against an fp32 reference from ext.reconstruct + exllamav3's get_weight_tensor Hadamard/sign "
        "formula in fp32, silu(g)*u rounded to fp16, routing weights as the fp16 values given to the kernel.",
    ]
    if args.codebook == "3inst":
        notes.append("3inst: BlockSparseMLP.support_fused is False (exl3_moe supports only mcg/mul1), so m >= "
                     "f_threshold (beyond bszN) runs the per-expert BC loop; no fused kernel to time alone.")
    if mixed:
        notes.append(
            "Mixed --bits: exllamav3 1.4.1 has no per-expert K within one call. exl3_mgemm takes one 'int K'; "
            "exl3_moe takes K_gate/K_up/K_down (one per projection, per-expert pointer tables only); MultiLinear "
            "asserts all experts share K, so BlockSparseMLP.load_local cannot build the fast paths for a mixed-K "
            "layer. Timed per tier instead: each tier is an expert-range shard (num_local_experts, routing_first/"
            "routing_last, routing_device=0, i.e. exllamav3's expert-parallel TP mechanism with a no-op broadcast), "
            "all shards see the full routing and run one after the other; 'layer' is the sum in one event pair, "
            "per-tier medians are in layer_us_per_tier. A shard takes bszN only at m = 1 (bszN at m > 1 requires "
            "min_expert == -1), the per-token exl3_mgemm loop at 1 < m < f_threshold, exl3_moe above.")

    # ---- build the layer (one shard per tier)
    routing = Routing()
    shards = []
    for t, (K, first, last) in enumerate(tiers):
        shards.append(build_shard(ev, geo, K, first, last, args.codebook, dev, gen, routing, mixed, f"moe.t{t}"))
    torch.cuda.synchronize()
    layer_bytes = sum((last - first) * expert_bytes(H, I, K) for K, first, last in tiers)
    f_threshold = shards[0].mlp.f_threshold
    print(f"exllamav3 {version}  {args.geometry} H={H} I={I} E={E} top-{topk}  bits={args.bits} {args.codebook}  "
          f"layer {layer_bytes / 1e6:.0f} MB  f_threshold={f_threshold}  fused={[s.fused for s in shards]}  "
          f"GPU mem {torch.cuda.memory_allocated() / 2**20:.0f} MiB", flush=True)

    spin_cpu = spin_cycles_per_us() if args.spin_us > 0 else 0.0
    spin_cycles = int(args.spin_us * spin_cpu)
    eb = EagerBufs(geo, dev)
    check_m = set(parse_list(args.check_m))
    warm = args.warmup or (args.routings + 2)

    def report(cases):
        return {
            "peer": f"exllamav3 {version}",
            "device": torch.cuda.get_device_name(0),
            "torch": torch.__version__,
            "geometry": {"name": args.geometry, **geo},
            "bits": args.bits,
            "tiers": [{"K": K, "first": a, "last": b, "expert_bytes": expert_bytes(H, I, K)} for K, a, b in tiers],
            "codebook": args.codebook,
            "layer_mb": layer_bytes / 1e6,
            "f_threshold": f_threshold,
            "reps": args.reps, "routings": args.routings, "xbufs": args.xbufs, "warmup": warm,
            "spin_us": args.spin_us, "spin_cycles_per_us": spin_cpu, "seed": args.seed,
            "max_memory_allocated_mib": torch.cuda.max_memory_allocated() / 2**20,
            "signatures": SIGNATURES,
            "cases": cases,
            "notes": notes,
        }

    hdr = (f"{'m':>5} {'path':<22} {'distinct':>8} {'MB':>7} {'layer us':>10} {'GB/s':>7} {'kernel us':>10} "
           f"{'kGB/s':>7} {'TFLOP/s':>8} {'rel-L2':>9}")
    print(hdr)
    cases = []
    for m in parse_list(args.m):
        case = {"m": m}
        try:
            routings = [make_routing(m, E, topk, gen, dev) for _ in range(args.routings)]
            xs = [torch.randn(m, H, generator=gen, device=dev).half() for _ in range(args.xbufs)]
            nr, nx = len(routings), len(xs)

            # Routing statistics (global and per tier)
            distinct, distinct_t, max_rows, over = [], [[] for _ in tiers], [], []
            for sel, _ in routings:
                cnt = torch.bincount(sel.reshape(-1), minlength=E).tolist()
                distinct.append(sum(1 for c in cnt if c))
                for ti, (_, a, b) in enumerate(tiers):
                    distinct_t[ti].append(sum(1 for c in cnt[a:b] if c))
                max_rows.append(max(cnt))
                over.append(sum(1 for c in cnt if c > temp_rows))
            d_mean = statistics.mean(distinct)
            dt_mean = [statistics.mean(v) for v in distinct_t]
            nbytes = case_bytes(dt_mean, tiers, H, I, m)
            flops = case_flops(m, topk, H, I)

            def set_routing(i):
                routing.sel, routing.w = routings[i % nr]

            # Path actually taken: one untimed, counted forward per shard
            set_routing(0)
            calls = [probe_calls(ev, bsm, sh, xs[0]) for sh in shards]
            labels = [path_label(c) for c in calls]
            base = [lab.split("(")[0] for lab in labels]

            def layer(i):
                set_routing(i)
                x = xs[i % nx]
                for sh in shards:
                    sh.mlp.forward(x, sh.params)

            t_layer = time_gpu(layer, args.reps, warm, spin_cycles)
            per_tier = None
            if mixed:
                per_tier = []
                for sh in shards:
                    def layer_one(i, sh=sh):
                        set_routing(i)
                        sh.mlp.forward(xs[i % nx], sh.params)
                    per_tier.append(time_gpu(layer_one, args.reps, warm, spin_cycles)["median"])

            # Kernel alone
            t_kernel, kernel_what, kout, preps = None, None, None, None
            if all(b_.startswith("fused") for b_ in base) and all(sh.fused for sh in shards):
                kernel_what = "exl3_moe"
                preps = [[prep_fused(sh, sel, w, temp_rows) for sh in shards] for sel, w in routings]
                kout = torch.zeros((m, H), dtype=torch.float, device=dev)

                def kernel(i):
                    x = xs[i % nx]
                    for sh, p in zip(shards, preps[i % nr]):
                        run_exl3_moe(ev, sh, x, kout, p)

                t_kernel = time_gpu(kernel, args.reps, warm, spin_cycles, pre=lambda i: kout.zero_())
            elif all(b_ == "bszN" for b_ in base):
                kernel_what = "eager exl3_mgemm x3 + silu_mul"

                def kernel(i):
                    sel, w = routings[i % nr]
                    x = xs[i % nx]
                    for sh in shards:
                        bszn_eager(ev, sh, x, sel, w, eb)

                t_kernel = time_gpu(kernel, args.reps, warm, spin_cycles)

            # Correctness against fp32 (routing 0, x 0)
            rl_layer = rl_kernel = None
            if m in check_m:
                set_routing(0)
                sel, w = routings[0]
                x = xs[0]
                y = torch.zeros((m, H), dtype=torch.float, device=dev)
                for sh in shards:
                    y += sh.mlp.forward(x, sh.params).float().view(m, H)   # bszN output is a shared buffer: add now
                ref = reference(shards, x, sel, w)
                rl_layer = rel_l2(y, ref)
                if kernel_what == "exl3_moe":
                    if all(p["overflow"] == 0 for p in preps[0]):
                        kout.zero_()
                        kernel(0)
                        rl_kernel = rel_l2(kout, ref)
                elif kernel_what is not None:
                    yk = torch.zeros((m, H), dtype=torch.float, device=dev)
                    for sh in shards:
                        yk += bszn_eager(ev, sh, x, sel, w, eb)
                    rl_kernel = rel_l2(yk, ref)
                torch.cuda.synchronize()

            us = t_layer["median"]
            case.update({
                "path": "|".join(labels),
                "path_description": [PATH_DESCRIPTIONS.get(b_, b_) for b_ in base],
                "calls_per_forward": calls,
                "distinct_experts": d_mean,
                "distinct_experts_per_tier": dt_mean if mixed else None,
                "max_rows_per_expert": max(max_rows),
                "experts_over_temp_rows": statistics.mean(over),
                "mb_touched": nbytes / 1e6,
                "layer_us": us, "layer_us_min": t_layer["min"], "layer_us_p90": t_layer["p90"],
                "layer_us_per_tier": per_tier,
                "gbps": nbytes / (us * 1e3),
                "kernel": kernel_what,
                "kernel_us": t_kernel["median"] if t_kernel else None,
                "kernel_us_min": t_kernel["min"] if t_kernel else None,
                "kernel_us_p90": t_kernel["p90"] if t_kernel else None,
                "kernel_gbps": nbytes / (t_kernel["median"] * 1e3) if t_kernel else None,
                "tflops": flops / (us * 1e6),
                "rel_l2_layer": rl_layer,
                "rel_l2_kernel": rl_kernel,
            })
            ku = f"{case['kernel_us']:10.1f}" if t_kernel else f"{'-':>10}"
            kg = f"{case['kernel_gbps']:7.0f}" if t_kernel else f"{'-':>7}"
            rl = f"{rl_layer:9.2e}" if rl_layer is not None else f"{'-':>9}"
            print(f"{m:>5} {case['path']:<22} {d_mean:8.1f} {nbytes / 1e6:7.0f} {us:10.1f} {case['gbps']:7.0f} "
                  f"{ku} {kg} {case['tflops']:8.2f} {rl}", flush=True)
            if mixed:
                print(f"{'':>5} per tier us: " + ", ".join(f"K{K}:{t:.1f}" for (K, _, _), t in zip(tiers, per_tier)),
                      flush=True)
            del routings, xs, preps, kout
        except Exception as e:  # keep the sweep going; report what failed
            case["error"] = f"{type(e).__name__}: {e}"
            print(f"{m:>5} ERROR {case['error']}", flush=True)
            try:
                torch.cuda.synchronize()
            except Exception:
                pass
        cases.append(case)
        torch.cuda.empty_cache()
        write_report(args.out, report(cases))   # after every case: a cut-off run still leaves its data

    print(f"wrote {args.out}")


def write_report(path, out):
    with open(path, "w") as f:
        json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
