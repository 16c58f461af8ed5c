"""Write a sweep's acceptance table into the demo pair's ``demo.json`` and ``MODEL_CARD.md``.

    ddtree-numba sweep --backend numpy --out figures/data/sweep_numpy.json
    python tools/record_acceptance.py figures/data/sweep_numpy.json [--cost figures/data/sweep_h100.json]
        [--demo-budget 64]

``demo.json`` gets an ``acceptance`` entry (the table rows, the best budget, and ``demo_budget`` /
``demo_budget_cuda``, the budgets ``ddtree-numba demo`` uses by default on numpy / cuda; the latter
is the budget of the most tokens/s in ``--cost``); the card's "## Acceptance" section (everything
from that heading to the "Size:" line) is replaced by the table. ``--cost``: a sweep on a GPU,
whose verify time and tokens/s per budget are added to the card.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from ddtree_numba.demo import DEMO_DIR  # noqa: E402
from ddtree_numba.stats import best_row, check, launches_label, summary_rows  # noqa: E402


def card_section(stats, rows, best, cost_rows, cost, demo_budget, source, cost_best) -> str:
    lines = ["## Acceptance", "",
             f"`{stats['command']}` ({stats['backend']} backend, {stats['device']}, {stats['date']}; "
             f"statistics in `{source}`): {len(stats['prompts'])} prompts from held-out modules, "
             f"{stats['max_new_tokens']} greedy tokens each. Every run's tokens equal greedy ar's.", "",
             "| method | budget | rounds | mean acceptance length | per-prompt range | tokens / target forward |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['method']} | {r['budget'] if r['budget'] else '-'} | {r['rounds']} | "
                     f"{r['mean_acceptance']:.2f} | {r['prompt_min']:.2f}-{r['prompt_max']:.2f} | "
                     f"{r['tokens_per_forward']:.2f} |")
    lines += ["", f"Best budget {best['budget']}: mean acceptance length {best['mean_acceptance']:.2f}, "
                  f"{best['tokens_per_forward']:.2f} tokens per target forward. `ddtree-numba demo` uses budget "
                  f"{demo_budget} on numpy" + (f" and {cost_best['budget']} on cuda (the most tokens/s below)" if cost_best else "")
                  + ".", ""]
    if cost_rows:
        lines += [f"On the GPU (`{cost['command']}`, {cost['device']}, {cost['date']}, every round on the GPU, "
                  f"{launches_label(cost)}):", "",
                  "| method | budget | mean acceptance length | verify ms / round | round ms | tokens / s |",
                  "|---|---|---|---|---|---|"]
        for r in cost_rows:
            lines.append(f"| {r['method']} | {r['budget'] if r['budget'] else '-'} | {r['mean_acceptance']:.2f} | "
                         f"{r['verify_ms']:.2f} | {r['round_ms']:.2f} | {r['tokens_per_s']:.0f} |")
        lines.append("")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("stats", help="statistics JSON of `ddtree-numba sweep` on the demo pair")
    ap.add_argument("--cost", help="the same sweep on a GPU (verify time, tokens/s)")
    ap.add_argument("--demo-budget", type=int, default=None,
                    help="default budget of `ddtree-numba demo` on numpy (default: the one recorded, else 64; "
                         "keep the CPU demo under a minute)")
    ap.add_argument("--dir", default=DEMO_DIR, help="the demo pair's directory")
    args = ap.parse_args(argv)
    with open(args.stats) as f:
        stats = json.load(f)
    check(stats)
    cost = None
    if args.cost:
        with open(args.cost) as f:
            cost = json.load(f)
        check(cost)
    # a sweep records its target's absolute path (of the machine it ran on): compare the tail
    pair_tail = os.path.join(*os.path.abspath(args.dir).split(os.sep)[-3:], "target")
    for name, s in (("STATS", stats), ("--cost", cost)):
        if s is not None and not os.path.normpath(s.get("target", "")).endswith(pair_tail):
            raise SystemExit(f"{name} is a sweep of {s.get('target')!r}, not of the demo pair in {args.dir}")
    rows, best = summary_rows(stats), best_row(stats)
    meta_path, card_path = os.path.join(args.dir, "demo.json"), os.path.join(args.dir, "MODEL_CARD.md")
    with open(meta_path) as f:
        meta = json.load(f)
    demo_budget = args.demo_budget or meta.get("acceptance", {}).get("demo_budget", 64)
    cost_best = None
    if cost:                     # on the GPU the demo takes the budget of the most tokens/s
        cost_best = max((r for r in summary_rows(cost) if r["method"] == "ddtree"), key=lambda r: r["tokens_per_s"])
    if demo_budget < 1:
        raise SystemExit(f"--demo-budget must be >= 1, got {demo_budget}")
    source = os.path.relpath(os.path.abspath(args.stats), ROOT)
    meta["acceptance"] = dict(source=source, command=stats["command"], backend=stats["backend"], date=stats["date"],
                              best_budget=best["budget"], best_mean_acceptance=round(best["mean_acceptance"], 3),
                              best_tokens_per_forward=round(best["tokens_per_forward"], 3),
                              demo_budget=demo_budget,
                              demo_budget_cuda=cost_best["budget"] if cost_best else demo_budget,
                              rows=[{k: r[k] for k in ("method", "budget", "rounds", "mean_acceptance",
                                                        "prompt_min", "prompt_max", "tokens_per_forward")}
                                    for r in rows])
    with open(meta_path, "w") as f:
        json.dump(meta, f, indent=1)
    with open(card_path) as f:
        card = f.read()
    head, sep, rest = card.partition("## Acceptance")
    if not sep:
        raise SystemExit(f"{card_path} has no '## Acceptance' section")
    size = rest[rest.index("Size:"):] if "Size:" in rest else ""
    section = card_section(stats, rows, best, summary_rows(cost) if cost else None, cost, demo_budget, source,
                           cost_best)
    with open(card_path, "w") as f:
        f.write(head + section + "\n" + size)
    print(f"best budget {best['budget']}: mean acceptance {best['mean_acceptance']:.2f}; wrote {meta_path} and {card_path}")


if __name__ == "__main__":
    main()
