"""Summarize a kernel's ncu source page by SASS instruction, from the CSV that
`ncu --import R.ncu-rep --page source --csv --print-source sass` writes:

    python tools/ncu_sass.py R.sass.csv [top]

Prints the instructions executed and the warp-stall samples in all, the hottest instructions by
samples (with the ones just before them: a stall is charged to the instruction that waits, so
the one it waits on is usually a few lines up), and the samples by opcode and by stall reason. A kernel run by one
warp or one block is a chain: its samples say which waits make it long. Map an address range to
Python lines with tools/sass_lines.py (static, the same compiler output up to the driver's).
"""

import collections

from ncu_summary import csv_command_line   # (a sibling: tools/ run as scripts)


def main():
    _, rows, top = csv_command_line(__doc__, 20)
    head_i = next((i for i, r in enumerate(rows) if r and r[0] == "Address"), None)
    if head_i is None:
        print("no Address column; the first rows:", rows[:3])
        return
    head = rows[head_i]
    col = {c: i for i, c in enumerate(head)}
    samp = col.get("Warp Stall Sampling (All Samples)")
    exe = col.get("Instructions Executed")
    data = []
    for r in rows[head_i + 1:]:
        if len(r) < len(head) or not r[0].startswith("0x"):
            continue
        data.append((r[0], r[1].strip(), float(r[samp] or 0), int(float(r[exe] or 0))))
    total_s = sum(d[2] for d in data) or 1
    print(f"{len(data)} instructions, {sum(d[3] for d in data)} executed (warp-level), "
          f"{total_s:.0f} stall samples")
    hot = sorted(range(len(data)), key=lambda i: -data[i][2])[:top]
    for i in sorted(hot):
        a, s, n, e = data[i]
        prev = " | ".join(d[1][:28] for d in data[max(0, i - 2):i])
        print(f"{i:5d} {100 * n / total_s:5.1f}% x{e:<6d} {s[:44]:44s}  after: {prev}")
    ops = collections.Counter()
    for a, s, n, e in data:
        op = s.split()[0] if not s.startswith("@") else s.split()[1]
        ops[op.split(".")[0]] += n
    print("samples by opcode:", ", ".join(f"{o} {100 * n / total_s:.0f}%" for o, n in ops.most_common(12)))
    reasons = [c for c in head if c.startswith("stall_") and "Not Issued" not in c]
    by = {c[6:]: sum(float(r[col[c]] or 0) for r in rows[head_i + 1:] if len(r) == len(head) and r[0].startswith("0x"))
          for c in reasons}
    total_r = sum(by.values()) or 1
    print("samples by reason:", ", ".join(f"{c} {100 * v / total_r:.0f}%" for c, v in
                                         sorted(by.items(), key=lambda x: -x[1]) if v >= 0.01 * total_r))


if __name__ == "__main__":
    main()
