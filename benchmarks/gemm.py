"""The GEMMs of kernels/linear.py (tensor cores) at the Moonlight-16B-A3B shapes, against their
floors and torch bf16 measured in the same run.

Usage (on a GPU machine): python benchmarks/gemm.py [--rows 1,16,64,256,1024] [--fp32-rows 1,256]
[--weights bf16|fp8] [--no-append] [--sweep NAMES]. Prints a table, appends it to
docs/PERFORMANCE.md and writes benchmarks/results/gemm.json (gemm_fp8.json with --weights fp8)
unless --no-append.

``--weights fp8``: every weight is float8 e4m3 with 128 x 128 block scales (``dtypes.BlockScaled``,
DeepSeek-V3's checkpoint format), multiplied as stored: a byte a weight, half the bf16 bytes.
``--weights int4``: int4 in groups of 32 (``dtypes.Int4Grouped``, Kimi K2.x's compressed-tensors
packing): half a byte a weight; results in gemm_int4.json.

Every enqueue variant runs with bfloat16 weights generated on the GPU: q_proj 2048->3072, kv_a
2048->576, o_proj 2048->2048 (accumulating into the residual), the per-head query absorption
16 x (128->512), dense SwiGLU 2048->11264 and down 11264->2048, grouped expert SwiGLU 64 x
(2048->1408) with 6 experts per row (rows gathered) and its down 1408->2048, lm_head
2048->163840; in precision 'bf16' at every row count and 'fp32' (faithful) at --fp32-rows. Time:
device time per launch, from a CUDA graph of REPS launches replayed (median of 10 replays).
Floor: max(bytes / 4.2 TB/s, FLOPs / the mma.sync ceiling measured at the start of the run),
bytes = weights read once (touched experts only) + activations in + outputs out. Peer: torch bf16
(F.linear; silu(x Wg) * (x Wu); torch._grouped_mm for the experts), also graph-timed.

Before timing, the outputs are checked on the GPU: sampled columns against the twin
(``reference.linear.linear`` of the same precision) within its accumulation bound, and row 0 of
every row count bit-identical to the one-row result (batch invariance across tiles).
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _common import COPY_BW, append_rows, mma_ceiling, random_bf16, random_fp8, random_int4, time_gpu  # noqa: E402
from ddtree_numba.dtypes import BlockScaled, Int4Grouped, bf16_to_float32  # noqa: E402
from ddtree_numba.reference.linear import accumulation_bound, linear as twin, swiglu_bound  # noqa: E402
from ddtree_numba.reference.moe import expert_work_items  # noqa: E402

REPS = 10                 # launches per captured graph
T0 = time.time()


def log(*a):
    print(f"[{time.time() - T0:6.1f}s]", *a, flush=True)


# -- the twin check -------------------------------------------------------------------------
def twin_check(got, x, w, precision, w_up=None):
    """(ok, worst error / bound) of ``got`` against the twin of ``precision`` (SwiGLU with
    ``w_up``: ``reference.linear.swiglu_bound``)."""
    if w_up is None:
        want = twin(x, w, precision).astype(np.float64)
        bound = accumulation_bound(x, w, precision)
    else:
        want, bound = swiglu_bound(x, w, w_up, precision)
    ratio = float((np.abs(got.astype(np.float64) - want) / bound).max()) if got.size else 0.0
    return ratio <= 1.0, ratio


# -- GPU helpers -----------------------------------------------------------------------------
class Gpu:
    def __init__(self, weights="bf16"):
        from numba import cuda
        self.cuda = cuda
        self.stream = cuda.stream()
        self.seed = 1
        self.weights = weights
        self.fp8 = weights != "bf16"                # quantized: fp8 or int4
        self.kind = {"bf16": "bf16", "fp8": "e4m3", "int4": "int4"}[weights]   # the kernels' name for it
        self.wbytes = {"bf16": 2, "fp8": 1, "int4": 0.5 + 2 / 32}[weights]   # bytes a weight (int4: + its bf16 group scale)

    def bf16(self, shape, scale):
        """Random weights of the run's storage: bf16 bits, or float8 + 128 x 128 block scales."""
        self.seed += 1
        if self.weights == "int4":
            return random_int4(shape, scale, self.seed - 1, self.stream)
        if self.fp8:
            return random_fp8(shape, scale, self.seed - 1, self.stream)
        return random_bf16(shape, scale, self.seed - 1, self.stream)

    def put(self, a):
        return self.cuda.to_device(np.ascontiguousarray(a), stream=self.stream)

    def empty(self, shape):
        return self.cuda.device_array(shape, np.float32, stream=self.stream)

    def zeros(self, shape):
        return self.put(np.zeros(shape, np.float32))


def weight_rows(w_host, rows):
    """Weight rows ``rows`` of a host copy (uint16 bf16 bits, or a BlockScaled of host arrays) as
    the twin takes them: float32, or a BlockScaled whose blocks are one row tall (each row keeps
    its own block scales)."""
    if isinstance(w_host, Int4Grouped):
        return Int4Grouped(np.ascontiguousarray(w_host.data[rows]), np.ascontiguousarray(w_host.scale[rows]),
                           w_host.group, w_host.in_features)
    if isinstance(w_host, BlockScaled):
        bo, bi = w_host.block
        return BlockScaled(np.ascontiguousarray(w_host.data[rows]), np.ascontiguousarray(w_host.scale[rows // bo]), (1, bi))
    return bf16_to_float32(w_host[rows])


def host_copy(w, z=None):
    """A device weight (or group z of it) on the host."""
    pick = (lambda a: a.copy_to_host()) if z is None else (lambda a: a[z].copy_to_host())  # noqa: E731
    if isinstance(w, (BlockScaled, Int4Grouped)):
        return w.with_arrays(pick(w.data), pick(w.scale))
    return pick(w)


def _graph_api():
    from cuda.bindings import runtime as rt
    return rt


def graph_time(fn, stream, reps=REPS, replays=10):
    """Device µs per call of ``fn`` from a CUDA graph of ``reps`` calls; eager fallback."""
    stream.synchronize()
    try:
        rt = _graph_api()
        h = int(stream.handle)
        err, = rt.cudaStreamBeginCapture(h, rt.cudaStreamCaptureMode.cudaStreamCaptureModeRelaxed)
        assert err == rt.cudaError_t.cudaSuccess, err
        try:
            for _ in range(reps):
                fn()
        finally:
            err, graph = rt.cudaStreamEndCapture(h)
        assert err == rt.cudaError_t.cudaSuccess, err
        err, gexec = rt.cudaGraphInstantiate(graph, 0)
        assert err == rt.cudaError_t.cudaSuccess, err

        def run():
            rt.cudaGraphLaunch(gexec, h)
    except Exception as exc:  # noqa: BLE001 - report and time eagerly
        log(f"graph capture failed ({exc!r}); eager timing")

        def run():
            for _ in range(reps):
                fn()
    return time_gpu(run, stream, reps=replays, warmup=1) / reps      # median of replays, per call


def torch_time(fn, reps=REPS, replays=10):
    import torch
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    try:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(reps):
                fn()

        def run():
            g.replay()
    except Exception as exc:  # noqa: BLE001
        log(f"torch graph failed ({exc!r}); eager timing")

        def run():
            for _ in range(reps):
                fn()
    run()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        run()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / reps)
    return statistics.median(times)


# -- the cases ------------------------------------------------------------------------------
H, E, TOPK = 2048, 64, 6
DENSE_I, MOE_I, VOCAB, HEADS, NOPE, KV = 11264, 1408, 163840, 16, 128, 512
SHARED_I = 2 * MOE_I          # Moonlight's two shared experts, one dense SwiGLU


def routing(rng, R):
    """Slots sorted by expert: offsets [E+1], token of each slot, distinct experts per token."""
    experts = np.stack([rng.choice(E, TOPK, replace=False) for _ in range(R)])     # [R, 6]
    slot_expert = experts.reshape(-1)
    slot_token = np.repeat(np.arange(R), TOPK)
    order = np.argsort(slot_expert, kind="stable")
    counts = np.bincount(slot_expert, minlength=E)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    return offsets, slot_token[order].astype(np.int32), counts


class Case:
    """One shape: weights, launch closures for a row count, floor bytes / FLOPs, the peer."""

    def __init__(self, name, variant):
        self.name, self.variant = name, variant


def build(gpu, L, rng, rows_max):
    st = gpu.stream
    W = {}
    log("generating weights")
    W["q"] = gpu.bf16((3072, H), H ** -0.5)
    W["kv_a"] = gpu.bf16((576, H), H ** -0.5)
    W["o"] = gpu.bf16((H, H), H ** -0.5)
    W["absorb"] = gpu.bf16((HEADS, KV, NOPE), NOPE ** -0.5)
    W["gate"] = gpu.bf16((DENSE_I, H), H ** -0.5)
    W["up"] = gpu.bf16((DENSE_I, H), H ** -0.5)
    W["down"] = gpu.bf16((H, DENSE_I), DENSE_I ** -0.5)
    W["sgate"] = gpu.bf16((SHARED_I, H), H ** -0.5)
    W["sup"] = gpu.bf16((SHARED_I, H), H ** -0.5)
    W["sdown"] = gpu.bf16((H, SHARED_I), SHARED_I ** -0.5)
    W["egate"] = gpu.bf16((E, MOE_I, H), H ** -0.5)
    W["eup"] = gpu.bf16((E, MOE_I, H), H ** -0.5)
    W["edown"] = gpu.bf16((E, H, MOE_I), MOE_I ** -0.5)
    W["lm"] = gpu.bf16((VOCAB, H), H ** -0.5)
    st.synchronize()
    X = {k: rng.standard_normal((rows_max, k)).astype(np.float32) for k in (H, DENSE_I, SHARED_I)}
    X[MOE_I] = rng.standard_normal((rows_max * TOPK, MOE_I)).astype(np.float32)
    X["heads"] = rng.standard_normal((rows_max, HEADS * NOPE)).astype(np.float32)
    dX = {k: gpu.put(v) for k, v in X.items()}
    return W, X, dX


def cases(gpu, L, W, X, dX, R, rng):
    """(name, variant, launch, outputs-check, bytes, flops, torch builder) for R rows."""
    st = gpu.stream
    n_rows = gpu.put(np.array([R], np.int32))
    out = []

    def plain(name, wkey, K, N, accumulate=False):
        w = W[wkey]
        o = gpu.zeros((R, N))           # an accumulating launch first adds into zeros
        x = dX[K][:R]
        fn = lambda cfg=None, p="bf16": L._launch(x, 0, w.reshape(1, N, K), None, o, 0, n_rows, None,  # noqa: E731
                                                  None, R, accumulate, p, st, cfg)
        byts = N * K * gpu.wbytes + R * K * 4 + R * N * 4 * (2 if accumulate else 1)
        out.append(dict(name=name, variant="linear+acc" if accumulate else "linear", fn=fn, out=o,
                        x=X[K][:R], w=w, K=K, N=N, bytes=byts, flops=2 * R * N * K,
                        peer=("linear", N, K), max_rows=R, n_cols=N, swiglu=False, grouped=False,
                        acc=accumulate, plan=lambda p: L._plan(x, 0, w.reshape(1, N, K), None, R, p)))

    plain("q_proj 2048->3072", "q", H, 3072)
    plain("kv_a 2048->576", "kv_a", H, 576)
    plain("o_proj 2048->2048", "o", H, H, accumulate=True)
    # per-head absorption: x [R, 16*128] -> out [R, 16*512]
    o_heads = gpu.empty((R, HEADS * KV))
    xh = dX["heads"][:R]
    out.append(dict(name="q absorb 16x(128->512)", variant="heads", out=o_heads, x=X["heads"][:R],
                    w=W["absorb"], K=NOPE, N=KV,
                    fn=lambda cfg=None, p="bf16": L._launch(xh, NOPE, W["absorb"], None, o_heads, KV,
                                                            n_rows, None, None, R, False, p, st, cfg),
                    bytes=HEADS * KV * NOPE * gpu.wbytes + R * HEADS * (NOPE + KV) * 4,
                    flops=2 * R * HEADS * KV * NOPE, peer=("heads",), max_rows=R, n_cols=KV,
                    swiglu=False, grouped=False, acc=False,
                    plan=lambda p: L._plan(xh, NOPE, W["absorb"], None, R, p)))
    def swiglu(name, gate, up, inner):
        o_sw = gpu.empty((R, inner))
        xs = dX[H][:R]
        out.append(dict(name=name, variant="swiglu", out=o_sw, x=X[H][:R], w=W[gate], w_up=W[up], K=H, N=inner,
                        fn=lambda cfg=None, p="bf16": L._launch(xs, 0, W[gate].reshape(1, inner, H),
                                                                W[up].reshape(1, inner, H), o_sw, 0,
                                                                n_rows, None, None, R, False, p, st, cfg),
                        bytes=2 * inner * H * gpu.wbytes + R * H * 4 + R * inner * 4,
                        flops=2 * 2 * R * inner * H, peer=("swiglu", inner, H), max_rows=R,
                        n_cols=inner, swiglu=True, grouped=False, acc=False,
                        plan=lambda p: L._plan(xs, 0, W[gate].reshape(1, inner, H), W[up].reshape(1, inner, H),
                                               R, p)))

    swiglu("dense SwiGLU 2048->11264", "gate", "up", DENSE_I)
    plain("dense down 11264->2048", "down", DENSE_I, H)
    swiglu("shared SwiGLU 2048->2816", "sgate", "sup", SHARED_I)
    plain("shared down 2816->2048", "sdown", SHARED_I, H)
    # experts: the grouped GEMMs take work items (expert, first slot, end slot) of the rows a block
    # of their tile multiplies (the counting sort's table, twin ``expert_work_items``), made here
    # once a row height; the down takes the gate|up's tile when the model does (``moe._down_tile``)
    offsets, slot_token, counts = routing(rng, R)
    S = R * TOPK
    d_tok = gpu.put(slot_token)
    mr = int(counts.max())
    touched = int((counts > 0).sum())
    items_of_rows = {}

    def items(tile):
        rows = L._rows_a_tile(tile)
        if rows not in items_of_rows:           # (first made by an eager call, never under a capture)
            items_of_rows[rows] = gpu.put(expert_work_items(offsets, rows, S))
        return items_of_rows[rows]

    o_e = gpu.empty((S, MOE_I))
    xe = dX[H][:R]
    up = dict(name="expert SwiGLU 64x(2048->1408) top-6", variant="grouped swiglu gather",
              out=o_e, x=X[H][:R], w=W["egate"], w_up=W["eup"], K=H, N=MOE_I,
              offsets=offsets, slot_token=slot_token,
              bytes=touched * 2 * MOE_I * H * gpu.wbytes + S * H * 4 + S * MOE_I * 4,
              flops=2 * 2 * S * MOE_I * H, peer=("grouped_swiglu",), max_rows=mr, n_cols=MOE_I,
              swiglu=True, grouped=True, acc=False, live=min(E, S),
              plan=lambda p: L._plan(xe, 0, W["egate"], W["eup"], mr, p, live_groups=min(E, S), grouped=True))
    up_tile = chosen_tile(up, "bf16")
    up["fn"] = lambda cfg=None, p="bf16": L._launch(
        xe, 0, W["egate"], W["eup"], o_e, 0, None, items(cfg or up_tile), d_tok, mr, False, p, st, cfg or up_tile,
        live_groups=min(E, S))
    out.append(up)
    o_d = gpu.empty((S, H))
    xd = dX[MOE_I][:S]
    down = dict(name="expert down 64x(1408->2048)", variant="grouped", out=o_d,
                x=X[MOE_I][:S], w=W["edown"], K=MOE_I, N=H, offsets=offsets, slot_token=None,
                bytes=touched * H * MOE_I * gpu.wbytes + S * MOE_I * 4 + S * H * 4,
                flops=2 * S * H * MOE_I, peer=("grouped",), max_rows=mr, n_cols=H,
                swiglu=False, grouped=True, acc=False, live=min(E, S),
                plan=lambda p: L._plan(xd, 0, W["edown"], None, mr, p, live_groups=min(E, S), grouped=True))
    own = chosen_tile(down, "bf16")
    down["tile"] = importlib.import_module("ddtree_numba.kernels.moe")._down_tile(up_tile, own) or own
    down["fn"] = lambda cfg=None, p="bf16": L._launch(     # the gate|up's work items, as in the model
        xd, 0, W["edown"], None, o_d, 0, None, items(up_tile), None, mr, False, p, st, cfg or down["tile"],
        live_groups=min(E, S))
    out.append(down)
    plain("lm_head 2048->163840", "lm", H, VOCAB)
    for c in out:
        c["R"] = R
        c["counts"] = counts
        c["live"] = {"heads": HEADS, "grouped": min(E, S), "grouped swiglu gather": min(E, S)}.get(c["variant"], 1)
    return out


# -- checks ---------------------------------------------------------------------------------
def fresh_out(c, stream=0):
    """Case c's output before a checked call: zeros where it accumulates, else NaN (so that an
    output the launch leaves unwritten fails the check, not passes on an earlier call's values)."""
    c["out"].copy_to_device(np.full(c["out"].shape, 0.0 if c["acc"] else np.nan, np.float32), stream=stream)


def check_case(c, rng, precision, ncols=24):
    """Sampled output columns (and rows) against the twin of ``precision``: (ok, error / bound)."""
    got = c["out"].copy_to_host()
    N = c["N"]
    cols = np.sort(rng.choice(N, min(ncols, N), replace=False))
    if c["variant"] in ("linear", "linear+acc"):
        return twin_check(got[:, cols], c["x"], weight_rows(host_copy(c["w"]), cols), precision)
    if c["variant"] == "heads":
        z = int(rng.integers(HEADS))
        return twin_check(got[:, z * KV + cols], c["x"][:, z * NOPE:(z + 1) * NOPE],
                          weight_rows(host_copy(c["w"], z), cols), precision)
    if c["variant"] == "swiglu":
        return twin_check(got[:, cols], c["x"], weight_rows(host_copy(c["w"]), cols), precision,
                          weight_rows(host_copy(c["w_up"]), cols))
    offsets = c["offsets"]                      # grouped: a few slots
    slots = rng.choice(int(offsets[-1]), min(8, int(offsets[-1])), replace=False)
    worst = 0.0
    for j in slots:
        z = int(np.searchsorted(offsets, j, side="right") - 1)
        xrow = c["x"][c["slot_token"][j] if c["slot_token"] is not None else j][None]
        _, ratio = twin_check(got[j, cols][None], xrow, weight_rows(host_copy(c["w"], z), cols), precision,
                              weight_rows(host_copy(c["w_up"], z), cols) if c["swiglu"] else None)
        worst = max(worst, ratio)
    return worst <= 1.0, worst


def report(tag, res):
    ok, ratio = res
    log(f"check {tag}: {'OK' if ok else 'FAIL'} (worst error / bound {ratio:.3f})")
    return ok


def small_kind_checks(gpu, L, rng):
    """f32 and f16 weights (element loads, the weights split in 'fp32'), both precisions."""
    ok = True
    for kind, dt in (("f32", np.float32), ("f16", np.float16)):
        for R, K in ((1, 2048), (5, 1030), (40, 2048), (200, 522)):
            N = 130
            x = rng.standard_normal((R, K)).astype(np.float32)
            w = (rng.standard_normal((N, K)) * 0.05).astype(dt)
            for precision in ("bf16", "fp32"):
                o = gpu.empty((R, N))
                L.enqueue_linear(gpu.put(x), gpu.put(w), o, gpu.put(np.array([R], np.int32)),
                                 precision=precision, stream=gpu.stream)
                ok &= report(f"{kind} R={R} K={K} {precision}",
                             twin_check(o.copy_to_host(), x, w.astype(np.float32), precision))
    return ok


# -- main -------------------------------------------------------------------------------------
def cfg_name(cfg):
    if isinstance(cfg, tuple) and hasattr(cfg, "WM"):
        ring = f" ring {cfg.NS}{'+x' if getattr(cfg, 'XA', 0) else ''}" if getattr(cfg, "NS", 0) else ""
        return f"staged {cfg.WM}x{cfg.WN} warps {cfg.MT}x{cfg.RT}{ring}"
    return f"{cfg.MT}x{cfg.RT} nw{cfg.NW}"


def chosen_tile(c, precision):
    """The tile ``_launch`` picks for case c in ``precision``: its own ``_plan``."""
    return c["plan"](precision).tile


# staged tiles with a cp.async weight ring (bf16 weights) tried beside the register alternatives:
# the chosen ones, larger warp tiles (more mma a fragment load) and tiles whose block covers a
# verify's live rows (8 RT WN: 24 >= 17, 72 / 80 >= 65: every block stages all the chunks whatever
# its live rows, so fewer row blocks cost less; `--ring-tiles` tries others)
RING_SWEEP = ((4, 1, 1, 2, 2), (4, 2, 1, 2, 2), (4, 1, 1, 1, 2), (2, 2, 2, 2, 2), (2, 2, 2, 4, 2), (2, 1, 2, 4, 2),
              (4, 2, 1, 4, 2), (2, 2, 1, 2, 3), (4, 1, 1, 3, 2), (8, 1, 1, 3, 2), (4, 3, 1, 3, 2), (4, 2, 1, 5, 2))


def sweep_cfgs(L, c, kind, ring_tiles=RING_SWEEP, ring_only=False):
    """Alternative tiles for one case (tuning runs): warps and warp tiles around the register
    kernel's choice (unless ``ring_only``), and (bf16 weights) the ring tiles of ``ring_tiles``
    that fit shared memory."""
    alts = []
    if not ring_only:
        cur = L._choose(c["max_rows"], c["n_cols"], c["K"], c["swiglu"], c["live"], kind)
        alts = {cur._replace(NW=max(1, cur.NW // 2)), cur._replace(NW=min(16, cur.NW * 2)),
                cur._replace(MT=3 - cur.MT), cur._replace(RT=max(1, cur.RT // 2)), cur._replace(RT=min(8, cur.RT * 2))}
        alts = [a for a in alts if a != cur and L._smem(a, c["swiglu"], kind) <= L._SMEM_MAX]
    if kind == "bf16" and c["K"] % 8 == 0:
        alts += [t for t in (L._Staged(*v) for v in ring_tiles)
                 if L._staged_smem(t, c["swiglu"], "bf16") <= L._SMEM_MAX]
    return alts


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="1,16,64,256,1024")
    ap.add_argument("--fp32-rows", default="1,256", help="row counts also timed in precision 'fp32'")
    ap.add_argument("--no-append", action="store_true")
    ap.add_argument("--sweep", default="", help="case-name substrings to try alternative tiles on")
    ap.add_argument("--budget", type=float, default=400.0, help="seconds of sweep; it stops past them")
    ap.add_argument("--ring-tiles", default="", metavar="WM,WN,MT,RT,NS;...",
                    help="the ring tiles a sweep tries (default: RING_SWEEP)")
    ap.add_argument("--ring-only", action="store_true", help="a sweep tries ring tiles only")
    ap.add_argument("--no-peer", action="store_true")
    ap.add_argument("--no-kind-checks", action="store_true",
                    help="skip the f32 / f16 weight checks at small shapes (a quick sweep)")
    ap.add_argument("--weights", choices=("bf16", "fp8", "int4"), default="bf16",
                    help="weight storage: bf16, float8 e4m3 with 128 x 128 block scales, or int4 in groups of 32")
    args = ap.parse_args()
    L = importlib.import_module("ddtree_numba.kernels.linear")
    rows = [int(r) for r in args.rows.split(",")]
    ring_tiles = (tuple(tuple(int(v) for v in t.split(",")) for t in args.ring_tiles.split(";"))
                  if args.ring_tiles else RING_SWEEP)
    fp32_rows = {int(r) for r in args.fp32_rows.split(",") if r}
    rng = np.random.default_rng(0)
    gpu = Gpu(args.weights)
    mma_rate = mma_ceiling(gpu.stream)
    log(f"mma.sync ceiling (register-only, this run): {mma_rate / 1e12:.0f} TFLOP/s")
    torch = None
    if not args.no_peer:
        try:
            import torch
            assert torch.cuda.is_available()
        except Exception as exc:  # noqa: BLE001
            log(f"no torch peer: {exc!r}")
            torch = None
    W, X, dX = build(gpu, L, rng, max(rows))
    ok = small_kind_checks(gpu, L, rng) if not (gpu.fp8 or args.no_kind_checks) else True
    table, sweep_rows, first_row, swept = [], [], {}, []
    peer_cache = {}
    for R in rows:
        for c in cases(gpu, L, W, X, dX, R, rng):
            peer = float("nan")
            if torch is not None:
                peer = peer_time(torch, c, R, peer_cache)
            for precision in ("bf16", "fp32") if R in fp32_rows else ("bf16",):
                cfg = c.get("tile") or chosen_tile(c, precision)
                fresh_out(c, gpu.stream)
                t0 = time.time()
                c["fn"](None, precision)
                gpu.stream.synchronize()
                tc = time.time() - t0
                ok &= report(f"{c['name']} R={R} {precision} [{cfg_name(cfg)}] (first call {tc:.1f}s)",
                             check_case(c, rng, precision))
                if c["variant"] in ("linear", "linear+acc", "swiglu", "heads"):   # batch invariance
                    got0 = c["out"].copy_to_host()[0]
                    key = (c["name"], precision)
                    if key in first_row:
                        same = np.array_equal(got0.view(np.uint32), first_row[key].view(np.uint32))
                        log(f"batch invariance {key} R={R} vs the first row count: {'OK' if same else 'FAIL'}")
                        ok &= same
                    else:
                        first_row[key] = got0
                us = graph_time(lambda: c["fn"](None, precision), gpu.stream)
                floor = max(c["bytes"] / COPY_BW, c["flops"] / mma_rate) * 1e6
                row = [c["name"], c["variant"], R, precision, cfg_name(cfg), f"{us:.1f}", f"{floor:.1f}",
                       f"{floor / us * 100:.0f}%", f"{c['flops'] / us / 1e6:.1f}",
                       f"{c['bytes'] / us / 1e3:.0f}", f"{peer:.1f}", f"{us / peer:.2f}"]
                table.append(row)
                log(" | ".join(str(v) for v in row))
            if args.sweep and any(n in c["name"] for n in args.sweep.split(",")):
                swept.append((c, R))
    sweep_start = time.time()
    for c, R in swept:              # alternative tiles, after the table is complete
        base = graph_time(lambda: c["fn"](None, "bf16"), gpu.stream)
        for alt in sweep_cfgs(L, c, gpu.kind, ring_tiles, args.ring_only):
            if time.time() - sweep_start > args.budget:
                log("sweep budget spent")
                break
            try:
                fresh_out(c, gpu.stream)
                c["fn"](alt, "bf16")
                gpu.stream.synchronize()
                good, _ = check_case(c, rng, "bf16")
                ua = graph_time(lambda: c["fn"](alt, "bf16"), gpu.stream)
                sweep_rows.append([c["name"], R, cfg_name(alt), f"{ua:.1f}", f"{base:.1f}", good])
                log(f"  alt {c['name']} R={R} {cfg_name(alt)}: {ua:.1f} us (chosen {base:.1f})"
                    + ("" if good else " CHECK FAILED"))
            except Exception as exc:  # noqa: BLE001
                log(f"  alt {cfg_name(alt)} failed: {exc!r}")
    header = ["gemm", "variant", "rows", "precision", "tile", "us", "floor_us", "floor/time", "tflops",
              "GB/s", "peer_us", "us/peer"]
    print("\nSWEEP", *sweep_rows, sep="\n")
    log(f"ALL CHECKS {'OK' if ok else 'FAILED'}")
    stored = {"fp8": "float8 e4m3 weights with 128 x 128 block scales (DeepSeek-V3's format, multiplied as stored: "
                     "the scales multiply each 64-k chunk's partial), generated on the GPU; the peer still bf16",
              "int4": "int4 weights in groups of 32 (Kimi K2.x's compressed-tensors packing, multiplied as stored: "
                      "the scales multiply each 32-k chunk's partial), generated on the GPU; the peer still bf16",
              "bf16": "bf16 weights generated on the GPU"}[gpu.weights]
    note = (f"Tensor cores (bf16 mma.sync m16n8k16 from numba), {stored}, f32 "
            f"activations rounded ('bf16') or split in two ('fp32') at the GEMM input. µs: device time per "
            f"launch from a CUDA graph of {REPS} launches (median of 10 replays). Floor: max(bytes / 4.2 TB/s, "
            f"FLOPs / {mma_rate / 1e12:.0f} TFLOP/s, the mma.sync ceiling measured in this run); bytes = "
            "weights once (touched experts only) + activations. Peer: torch bf16 (F.linear; silu(x Wg) * "
            "(x Wu); torch._grouped_mm), graph-timed in the same run. Experts: each row picks 6 distinct "
            "experts of 64 at random; the tile is picked from the largest group. Checks on the GPU: "
            f"{'all passed' if ok else 'SOME FAILED'} (sampled columns against the twin within its "
            "accumulation bound; row 0 identical for every row count).")
    title = (f"GEMM, {gpu.weights} weights (benchmarks/gemm.py --weights {gpu.weights})" if gpu.fp8
             else "GEMM (benchmarks/gemm.py)")
    append_rows(title, header, table, note, append=not args.no_append,
                results=f"gemm_{gpu.weights}" if gpu.fp8 else "gemm")
    return 0 if ok else 1


def peer_time(torch, c, R, cache):
    import torch.nn.functional as F
    kind = c["peer"][0]
    dev = "cuda"
    bf = torch.bfloat16
    key = (c["name"],)
    if key not in cache:   # peer weights: same shapes, torch's own random values
        if kind == "linear":
            N, K = c["peer"][1], c["peer"][2]
            cache[key] = (torch.randn(N, K, device=dev, dtype=bf) * K ** -0.5,)
        elif kind == "heads":
            cache[key] = (torch.randn(HEADS, NOPE, KV, device=dev, dtype=bf),)
        elif kind == "swiglu":
            N, K = c["peer"][1], c["peer"][2]
            cache[key] = (torch.randn(N, K, device=dev, dtype=bf), torch.randn(N, K, device=dev, dtype=bf))
        elif kind == "grouped_swiglu":
            cache[key] = (torch.randn(E, H, MOE_I, device=dev, dtype=bf),
                          torch.randn(E, H, MOE_I, device=dev, dtype=bf))
        else:
            cache[key] = (torch.randn(E, MOE_I, H, device=dev, dtype=bf),)
    ws = cache[key]
    if kind == "linear":
        x = torch.randn(R, c["peer"][2], device=dev, dtype=bf)
        fn = lambda: F.linear(x, ws[0])  # noqa: E731
    elif kind == "heads":
        x = torch.randn(HEADS, R, NOPE, device=dev, dtype=bf)
        fn = lambda: torch.bmm(x, ws[0])  # noqa: E731
    elif kind == "swiglu":
        x = torch.randn(R, H, device=dev, dtype=bf)
        fn = lambda: F.silu(F.linear(x, ws[0])) * F.linear(x, ws[1])  # noqa: E731
    else:
        counts = torch.tensor(c["counts"], device=dev)
        offs = torch.cumsum(counts, 0).to(torch.int32)
        S = int(c["counts"].sum())
        K = H if kind == "grouped_swiglu" else MOE_I
        xs = torch.randn(S, K, device=dev, dtype=bf)
        if hasattr(torch, "_grouped_mm"):
            if kind == "grouped_swiglu":
                fn = lambda: F.silu(torch._grouped_mm(xs, ws[0], offs=offs)) * torch._grouped_mm(xs, ws[1], offs=offs)  # noqa: E731,E501
            else:
                fn = lambda: torch._grouped_mm(xs, ws[0], offs=offs)  # noqa: E731
        else:
            bounds = np.concatenate([[0], np.cumsum(c["counts"])])
            groups = [(z, int(bounds[z]), int(bounds[z + 1])) for z in range(E) if bounds[z + 1] > bounds[z]]

            def fn():
                for z, a, b in groups:
                    if kind == "grouped_swiglu":
                        F.silu(xs[a:b] @ ws[0][z]) * (xs[a:b] @ ws[1][z])
                    else:
                        xs[a:b] @ ws[0][z]
    try:
        return torch_time(fn)
    except Exception as exc:  # noqa: BLE001
        log(f"peer {c['name']} failed: {exc!r}")
        return float("nan")


if __name__ == "__main__":
    sys.exit(main())
