"""Sum an ``ncu --csv --metrics gpu__time_duration.sum`` listing by kernel:
python tools/ncu_summary.py FILE [FILE ...] (e.g. the two sides of ``tools/h200_ab.sh`` PART=stages),
or python tools/ncu_summary.py --diff A B [MIN_US].

Prints, for each file, each kernel (numba's demangled name, shortened to module and function)
with its launch count and total / mean time, largest first, then the launches in order, with
their grid and, where the listing has ``launch__registers_per_thread``, their registers.

``--diff A B``: the two listings' last launches side by side, aligned from the end (A / B of one
round at two commits; or ar's round against ddtree's, whose verify forward is its tail: the draft
and tree launches before it are left out), with the aligned launches' totals first, then
each pair whose times differ by more than MIN_US (default 1). (Under ncu each kernel
runs alone: small kernels read ~2-3 µs above their time inside a graph.)"""

import argparse
import csv
import re
from collections import defaultdict

# ncu picks the unit of each row's duration
_US = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}


def csv_command_line(doc: str, default_top: int) -> tuple[str, list[list[str]], int]:
    """The command line of a tool that reads one ncu CSV (``ncu_lines``, ``ncu_sass``,
    ``ncu_stalls``): ``PATH [TOP]``, ``doc`` its help. Returns (the path, the CSV's rows, top)."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0], epilog=doc,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("path", help="the CSV that ncu wrote")
    ap.add_argument("top", type=int, nargs="?", default=default_top, help=f"how many to print (default {default_top})")
    args = ap.parse_args()
    with open(args.path, newline="") as f:
        return args.path, list(csv.reader(f)), args.top


def short(name: str) -> str:
    name = name.split("(")[0].replace("cudapy::", "").replace("ddtree_numba::", "")
    name = re.sub(r"\[abi:[^\]]*\]", "", name).replace("::<locals>", "").replace("_3clocals_3e", "")
    return name


def launches(path: str) -> list[dict]:
    """The launches of one listing in order: name, grid, registers (None if not listed), µs."""
    rows: dict[str, dict] = {}
    with open(path) as f:
        lines = [ln for ln in f if ln.startswith('"')]
    for r in csv.DictReader(lines):
        k = rows.setdefault(r["ID"], {"name": short(r["Kernel Name"]), "grid": r.get("Grid Size", ""),
                                      "regs": None, "us": 0.0})
        value = float(r["Metric Value"].replace(",", ""))
        if r.get("Metric Name") == "gpu__time_duration.sum":
            k["us"] = value * _US[r["Metric Unit"]]
        elif r.get("Metric Name") == "launch__registers_per_thread":
            k["regs"] = int(value)
    return list(rows.values())


def summarize(path: str) -> None:
    rows = launches(path)
    total = defaultdict(float)
    count = defaultdict(int)
    for k in rows:
        total[k["name"]] += k["us"]
        count[k["name"]] += 1
    print(f"{path}: {len(rows)} launches, {sum(total.values()):.1f} µs of kernel time")
    for name in sorted(total, key=total.get, reverse=True):
        print(f"{total[name]:9.1f} µs  {count[name]:4d} x {total[name] / count[name]:7.2f}  {name}")
    print("\nin order:")
    for k in rows:
        regs = "" if k["regs"] is None else f"{k['regs']:4d} regs  "
        print(f"{k['us']:8.2f}  {k['grid']:<14} {regs}{k['name']}")


def diff(path_a: str, path_b: str, min_us: float = 1.0) -> None:
    a, b = launches(path_a), launches(path_b)
    n = min(len(a), len(b))
    a, b = a[len(a) - n:], b[len(b) - n:]
    print(f"the last {n} launches of {path_a} (A) and {path_b} (B): {sum(k['us'] for k in a):.1f} / "
          f"{sum(k['us'] for k in b):.1f} µs")
    for i, (x, y) in enumerate(zip(a, b)):
        if abs(y["us"] - x["us"]) > min_us:
            print(f"{i:4d}  {x['us']:7.2f} {x['grid']:<12} {x['name'][:44]:<44} | {y['us']:7.2f} {y['grid']:<12} "
                  f"{y['name'][:44]:<44} {y['us'] - x['us']:+7.2f}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="+", metavar="FILE", help="ncu listings (with --diff: A B [MIN_US])")
    ap.add_argument("--diff", action="store_true", help="A and B side by side, aligned from the end")
    args = ap.parse_args()
    if args.diff:
        if not 2 <= len(args.files) <= 3:
            ap.error("--diff takes A B [MIN_US]")
        diff(args.files[0], args.files[1], *(float(v) for v in args.files[2:]))
    else:
        for p in args.files:
            summarize(p)
