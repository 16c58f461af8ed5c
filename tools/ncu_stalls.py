"""Each kernel's warp-stall breakdown from ncu's raw page (``ncu ... --section WarpStateStats --csv
--page raw``), summed by kernel name: where a launch's time goes when it is latency-bound.

    python tools/ncu_stalls.py raw.csv [top]

Per kernel name: launches, µs in all (gpu__time_duration), the warp cycles an issued instruction,
and the share of them by reason (no_instruction: the instruction fetch; wait: fixed-latency
dependencies; barrier; short / long scoreboard: shared-memory / global loads; ...). Then the whole
profile's shares weighted by each kernel's time.
"""

import collections
import re

from ncu_summary import csv_command_line   # (a sibling: tools/ run as scripts)

_STALL = re.compile(r"^smsp__average_warps?(?:_latency)?_issue_stalled_(\w+?)_per_(?:issue|warp)_active\.ratio$")


def _num(v):
    try:
        return float(str(v).replace(",", ""))
    except ValueError:
        return 0.0


def main():
    path, rows, top = csv_command_line(__doc__, 30)
    head_i = next((i for i, r in enumerate(rows) if "Kernel Name" in r), None)
    if head_i is None:
        raise SystemExit(f"{path}: no 'Kernel Name' column")
    head = rows[head_i]
    col = {c: i for i, c in enumerate(head)}
    stalls = {m.group(1): i for c, i in col.items() if (m := _STALL.match(c))}
    if not stalls:
        raise SystemExit("no stall columns; those with 'stalled': "
                         + ", ".join(c for c in head if "stalled" in c)[:2000])
    dur = col.get("gpu__time_duration.sum")
    by = collections.defaultdict(lambda: [0, 0.0, collections.Counter()])
    for r in rows[head_i + 1:]:
        if len(r) != len(head) or not r[dur].strip() or not r[dur][0].isdigit():
            continue                                      # (the units row)
        name = re.sub(r"\[.*|\(.*", "", r[col["Kernel Name"]]).split("::")[-2:]
        name = "::".join(name)
        us = _num(r[dur]) / 1e3                           # ns -> µs
        e = by[name]
        e[0] += 1
        e[1] += us
        for k, i in stalls.items():
            e[2][k] += _num(r[i]) * us                    # time-weighted cycles an issue by reason
    total = sum(e[1] for e in by.values()) or 1
    print(f"{sum(e[0] for e in by.values())} launches, {total:.1f} µs of kernel time (each alone)")
    print("| kernel | launches | µs | share | cycles an issue | no_inst | wait | barrier | short_sb | long_sb | other |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    all_ = collections.Counter()
    for name, (n, us, st) in sorted(by.items(), key=lambda x: -x[1][1])[:top]:
        cyc = sum(st.values()) / us if us else 0
        sh = {k: v / (sum(st.values()) or 1) for k, v in st.items()}
        main5 = ("no_instruction", "wait", "barrier", "short_scoreboard", "long_scoreboard")
        other = 1 - sum(sh.get(k, 0) for k in main5)
        print(f"| {name[:48]} | {n} | {us:.1f} | {100 * us / total:.0f}% | {cyc:.1f} | "
              + " | ".join(f"{100 * sh.get(k, 0):.0f}%" for k in main5) + f" | {100 * other:.0f}% |")
    for n, us, st in by.values():
        all_.update(st)
    s = sum(all_.values()) or 1
    print("time-weighted over every kernel:", ", ".join(f"{k} {100 * v / s:.0f}%" for k, v in all_.most_common(10)))


if __name__ == "__main__":
    main()
