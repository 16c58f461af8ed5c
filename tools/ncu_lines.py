"""Print the source lines of a kernel that hold the most warp-stall samples, from the CSV that
`ncu --import R.ncu-rep --page source --csv --print-source cuda` writes (DDTREE_LINEINFO=1 when
profiling, so the SASS maps to Python lines):

    python tools/ncu_lines.py source.csv [top]
"""

import argparse
import csv


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("path", help="the CSV that ncu wrote")
    ap.add_argument("top", type=int, nargs="?", default=25, help="how many to print (default 25)")
    args = ap.parse_args()
    path, top = args.path, args.top
    with open(path, newline="") as f:
        rows = [r for r in csv.reader(f)]
    found = [i for i, r in enumerate(rows) if any("Sampling" in c for c in r)]
    if not found:
        print("no sampling column; the first rows:", rows[:3])
        return
    head_i = found[0]
    head = rows[head_i]
    cols = [i for i, c in enumerate(head) if "Warp Stall Sampling (All" in c] or \
           [i for i, c in enumerate(head) if "Sampling" in c]
    src = next((i for i, c in enumerate(head) if c in ("Source", "# Source")), 1)
    print("columns:", head[:12])
    line = next((i for i, c in enumerate(head) if c in ("#", "Line", "# Line")), 0)
    data = []
    for r in rows[head_i + 1:]:
        if len(r) <= max(cols):
            continue
        try:
            n = float(r[cols[0]].replace(",", "") or 0)
        except ValueError:
            continue
        data.append((n, r[line], r[src].strip()[:110]))
    total = sum(d[0] for d in data) or 1
    print(f"columns: {head[cols[0]]!r}; total samples {total:.0f}")
    for n, ln, s in sorted(data, reverse=True)[:top]:
        print(f"{100 * n / total:5.1f}%  {ln:>5}  {s}")


if __name__ == "__main__":
    main()
