"""The demo pair's DDTree budget sweep on the GPU: acceptance, verify time and tokens/s per budget.

Usage (on a GPU machine): python benchmarks/demo_pair.py [--budgets 4 8 16 ... 1024] [--new 128]
    [--json FILE] [--no-append] [--peer] [--peer-device cuda|cpu]
or, to table a sweep already made (say by `ddtree-numba sweep --backend cuda --out FILE`):
    python benchmarks/demo_pair.py --from-json FILE [--device NAME] [--commit SHA]

Every held-out prompt of the trained demo pair (ddtree_numba.demo_pair()), greedy, ar, the DFlash
chain and ddtree at each budget, every round on the GPU (eager launches, each configuration
warmed up first); per-round CUDA-event times. The floor column is the verify forward's weight
bytes over the copy rate (the pair is 26 MB, so launch latency, not bandwidth, decides).

``--peer``: HF transformers' own greedy ``generate`` on the demo target (its DeepseekV3ForCausalLM,
bf16 as stored) over the same prompts and token counts, in the same run: tokens/s, and how many of
its generations equal this package's ``ar`` tokens (bf16 arithmetic in HF against float32 here, so
a long generation may part ways at a near-tie). ``--peer-device cpu`` runs it on the CPU, which
checks the code path on a machine without a GPU.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import COPY_BW, append_rows  # noqa: E402


def table(stats, weight_bytes):
    from ddtree_numba.stats import summary_rows
    floor_ms = weight_bytes / COPY_BW * 1e3
    rows = []
    for r in summary_rows(stats):
        rows.append([r["method"], r["budget"] or "-", r["rounds"], f"{r['mean_acceptance']:.2f}",
                     f"{r['tokens_per_forward']:.2f}", f"{r['verify_ms']:.2f}" if r["verify_ms"] else "-",
                     f"{floor_ms:.3f}",
                     f"{r['round_ms']:.2f}", f"{r['tokens_per_s']:.0f}", "yes" if r["all_equal_ar"] else "NO"])
    return rows


def hf_greedy(target_dir, prompts, new, device="cuda"):
    """HF transformers' greedy generate on the demo target: (tokens/s over every prompt after one
    warm-up generation, [generated ids per prompt])."""
    import torch
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.bfloat16).to(device).eval()

    def sync():
        if device != "cpu":
            torch.cuda.synchronize()

    def run(ids):
        x = torch.tensor([ids], device=device)
        with torch.no_grad():
            out = model.generate(x, max_new_tokens=new, min_new_tokens=new, do_sample=False, eos_token_id=None,
                                 pad_token_id=0)
        return out[0, x.shape[1]:].tolist()

    run(prompts[0]["ids"])                       # warm-up
    sync()
    t0 = time.perf_counter()
    outs = [run(p["ids"]) for p in prompts]
    sync()
    return sum(len(o) for o in outs) / (time.perf_counter() - t0), outs


def peer_rows(target, prompts, new, device):
    """The peer's table row and record: HF greedy tokens/s against this package's ar tokens."""
    import ddtree_numba as dd
    tps, outs = hf_greedy(dd.demo_pair()[0], prompts, new, device)
    ours = [dd.generate(target, None, p["ids"], new, method="ar").tokens.tolist() for p in prompts]
    equal = sum(a == b for a, b in zip(outs, ours))
    common = [next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b))) for a, b in zip(outs, ours)]
    return ["hf", "-", "-", "1.00", "1.00", "-", "-", "-", f"{tps:.0f}",
            f"{equal}/{len(prompts)} (common prefix {sum(common) / len(common):.0f} tokens)"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # (budgets 4 and 8 are for benchmarks/batch.py, which replays this file's acceptance: at batch 16
    # small trees may pay better than 16, PLANS §4)
    ap.add_argument("--budgets", type=int, nargs="+", default=[4, 8, 16, 32, 64, 128, 256, 512, 1024])
    ap.add_argument("--new", type=int, default=128, help="greedy tokens per prompt")
    ap.add_argument("--json", metavar="FILE", help="also write the sweep's statistics JSON")
    ap.add_argument("--from-json", metavar="FILE", help="table this sweep instead of running one")
    ap.add_argument("--device", help="with --from-json: the device it ran on (default: the JSON's)")
    ap.add_argument("--commit", help="with --from-json: the commit it ran at")
    ap.add_argument("--no-append", action="store_true")
    ap.add_argument("--eager", action="store_true",
                    help="launch each stage from Python (timed per stage) instead of one CUDA graph a round")
    ap.add_argument("--peer", action="store_true", help="also time HF transformers' greedy generate, same run")
    ap.add_argument("--peer-device", default="cuda", help="where the peer runs (cpu: a check without a GPU)")
    args = ap.parse_args()

    import ddtree_numba as dd
    from ddtree_numba.demo import demo_metadata
    meta = demo_metadata()
    if args.from_json:
        with open(args.from_json) as f:
            stats = json.load(f)
    else:
        from ddtree_numba.stats import acceptance_sweep
        t_dir, d_dir = dd.demo_pair()
        target = dd.load_target(t_dir, backend="cuda", progress=False)
        stats = acceptance_sweep(target, dd.load_drafter(d_dir, target), meta["prompts"], args.new, args.budgets,
                                 graph=False if args.eager else None, progress=False, info=dict(command="python benchmarks/demo_pair.py"))
        if args.json:
            with open(args.json, "w") as f:
                json.dump(stats, f, indent=1)
    header = ["method", "budget", "rounds", "mean acceptance", "tokens / forward", "verify ms", "floor ms",
              "round ms", "tokens/s", "== ar"]
    rows = table(stats, meta["bytes"]["target"])
    peer_note = "No peer (HF) in this run (--peer measures it)."
    if args.peer and not args.from_json:
        rows.append(peer_rows(target, meta["prompts"], args.new, args.peer_device))
        peer_note = (f"Peer: HF transformers' greedy generate on the same target (bf16, {args.peer_device}), same "
                     "prompts and token counts, this run; its last column: generations equal to this package's ar.")
    graph = any(r["stage_times_s"].get("round", 0.0) > 0 for r in stats["runs"])   # rounds replayed as graphs
    how = ("each round replayed as one CUDA graph (verify not timed apart: '-')" if graph else
           "eager launches, each stage timed")
    note = (f"Demo pair (`{stats['command']}`, {stats['backend']} backend, {stats['device']}): "
            f"{len(stats['prompts'])} held-out prompts x {stats['max_new_tokens']} greedy tokens, every round "
            f"on the GPU, {how}, warmed up; per-round CUDA-event means; tokens/s over each call's wall "
            "clock (prefill included). Floor: the target's weight "
            f"bytes over 4.2 TB/s. {peer_note}")
    title = "Demo pair, DDTree budget sweep on the GPU (benchmarks/demo_pair.py)"
    if args.from_json:
        title += f", tabled from {args.from_json}"
    kw = dict(device=args.device or stats["device"], commit_id=args.commit, date=stats["date"]) if args.from_json else {}
    keys = ["method", "budget", "rounds", "mean_acceptance", "tokens_per_forward", "verify_ms", "floor_ms",
            "round_ms", "tokens_per_s", "equal_ar"]
    values = []                                # the results file's rows: ar / dflash / ddtree / hf
    for r in rows:
        ours = r[0] != "hf"
        values.append(r[:9] + [r[9] == "yes" if ours else r[9], graph if ours else None])
        r.append(("yes" if graph else "no") if ours else "-")
    append_rows(title, header + ["graph"], rows, note, append=not args.no_append, results="demo_pair",
                command=stats["command"], keys=keys + ["graph"], values=values, **kw)


if __name__ == "__main__":
    main()
