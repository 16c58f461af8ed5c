"""Sum an ``ncu --csv --metrics gpu__time_duration.sum`` listing by kernel: python tools/ncu_summary.py FILE.

Prints each kernel (numba's demangled name, shortened to module and function) with its launch
count and total / mean time, largest first, then the launches in order."""

import csv
import re
import sys
from collections import defaultdict


def short(name: str) -> str:
    name = name.split("(")[0].replace("cudapy::", "").replace("ddtree_numba::", "")
    name = re.sub(r"\[abi:[^\]]*\]", "", name).replace("::<locals>", "").replace("_3clocals_3e", "")
    return name


def main(path):
    rows = []
    with open(path) as f:
        lines = [ln for ln in f if ln.startswith('"')]
    for r in csv.DictReader(lines):
        if r.get("Metric Name") == "gpu__time_duration.sum":
            scale = {"nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3}.get(r.get("Metric Unit"), 1.0)
            rows.append((short(r["Kernel Name"]), float(r["Metric Value"].replace(",", "")) * scale))
    total = defaultdict(float)
    count = defaultdict(int)
    for name, us in rows:
        total[name] += us
        count[name] += 1
    print(f"{len(rows)} launches, {sum(total.values()):.1f} µs of kernel time")
    for name in sorted(total, key=total.get, reverse=True):
        print(f"{total[name]:9.1f} µs  {count[name]:4d} x {total[name] / count[name]:7.2f}  {name}")
    print("\nin order:")
    for name, us in rows:
        print(f"{us:8.2f}  {name}")


if __name__ == "__main__":
    main(sys.argv[1])
