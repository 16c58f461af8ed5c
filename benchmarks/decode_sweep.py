"""The GPU-resident DDTree loop over tree budgets: target forwards per token and per-stage time.

Usage (on a GPU machine): python benchmarks/decode_sweep.py [--budgets 16 32 64 128 256]
    [--new 64] [--no-append]

Two drafters on the golden tiny target (tests/data/v3_noaux_tc, 3 layers, vocab 96):
- ``oracle``: the tests' noisy oracle (the target's own greedy continuation, right token at rank 0
  with probability 0.8, else rank 1-3), so acceptance is that of a good drafter. Its draft stage
  syncs to the host (a test adapter), so its draft time is not a GPU figure.
- ``dflash``: the golden DFlash drafter (random weights: it accepts almost nothing), a real
  device draft: its stage times are those of the GPU-resident round.
Each budget is warmed up first (numba compiles a kernel at its first shape). Per-stage times are
CUDA-event times summed over the run, divided by the rounds. Until the
trained demo pair (issue 6) exists, acceptance from real drafters cannot be measured here.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT / "tests"))
from _common import append_rows  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--budgets", type=int, nargs="+", default=[16, 32, 64, 128, 256])
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--no-append", action="store_true")
    args = ap.parse_args()
    import ddtree_numba as dd
    from test_decode_cuda import DeviceOracle
    from test_decode import _prompt

    data = ROOT / "tests" / "data"
    host = dd.load_target(data / "v3_noaux_tc")
    gpu = dd.load_target(data / "v3_noaux_tc", backend="cuda")
    drafter = dd.load_drafter(data / "drafters" / "dflash_v3_noaux_tc", gpu)
    prompt = _prompt(1, 96, n=8)
    want = dd.generate(host, None, prompt, args.new, method="ar").tokens
    seq = np.concatenate([prompt, want]).astype(np.int32)
    feats = host.forward(seq, np.arange(len(seq), dtype=np.int32), host.new_cache(len(seq)),
                         hidden_layer_ids=(0, 1)).hidden
    def warm(d, method, b=8):   # compile every kernel shape of this budget before timing it
        dd.generate(gpu, d, prompt, 6, method=method, budget=b)

    warm(None, "ar")
    ar = dd.generate(gpu, None, prompt, args.new, method="ar")
    assert (ar.tokens == want).all()
    rows = [["ar", "-", "1.00", f"{ar.tokens.size / ar.target_forwards:.2f}",
             f"{ar.stage_times['verify'] / max(len(ar.acceptance_lengths), 1) * 1e3:.3f}", "-", "-", "-",
             f"{ar.stage_times['accept'] / max(len(ar.acceptance_lengths), 1) * 1e3:.3f}",
             f"{ar.stage_times['compact'] / max(len(ar.acceptance_lengths), 1) * 1e3:.3f}",
             f"{ar.tokens.size / ar.elapsed_s:.0f}"]]
    for name in ("oracle", "dflash"):
        for b in args.budgets:
            d = DeviceOracle(seq, feats, 96, 0.8, seed=b, block_size=16) if name == "oracle" else drafter
            warm(DeviceOracle(seq, feats, 96, 0.8, seed=b, block_size=16) if name == "oracle" else drafter,
                 "ddtree", b)
            res = dd.generate(gpu, d, prompt, args.new, method="ddtree", budget=b)
            assert (res.tokens == want).all(), f"{name} budget {b}: tokens differ from ar"
            r = max(len(res.acceptance_lengths), 1)
            ms = {k: v / r * 1e3 for k, v in res.stage_times.items()}
            rows.append([name, b, f"{res.mean_acceptance_length:.2f}",
                         f"{res.tokens.size / res.target_forwards:.2f}", f"{ms['verify']:.3f}",
                         f"{ms['draft']:.3f}" if name == "dflash" else "(host)", f"{ms['topk']:.3f}",
                         f"{ms['build']:.3f}", f"{ms['accept']:.3f}", f"{ms['compact']:.3f}",
                         f"{res.tokens.size / res.elapsed_s:.0f}"])
    header = ["drafter", "budget", "mean acceptance", "tokens / target forward", "verify ms",
              "draft ms", "top-K ms", "build ms", "accept ms", "compact ms", "tokens/s"]
    note = (f"GPU-resident loop (decode.device), golden tiny target v3_noaux_tc, {args.new} new tokens, "
            "greedy, eager launches; per-round CUDA-event times; every run's tokens equal ar's.")
    append_rows("DDTree loop on the GPU, budget sweep (benchmarks/decode_sweep.py)", header, rows, note,
                append=not args.no_append)


if __name__ == "__main__":
    main()
