"""Print the source lines of a kernel that hold the most warp-stall samples, from the CSV that
`ncu --import R.ncu-rep --page source --csv --print-source cuda` writes (DDTREE_LINEINFO=1 when
profiling, so the SASS maps to Python lines):

    python tools/ncu_lines.py source.csv [top]
"""


from ncu_summary import csv_command_line   # (a sibling: tools/ run as scripts)


def main():
    _, rows, top = csv_command_line(__doc__, 25)
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
