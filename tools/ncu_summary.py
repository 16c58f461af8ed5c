"""Sum an ``ncu --csv --metrics gpu__time_duration.sum`` listing by kernel:
python tools/ncu_summary.py FILE [FILE ...] (e.g. the two sides of ``tools/h200_ab.sh`` PART=stages).

Prints, for each file, each kernel (numba's demangled name, shortened to module and function)
with its launch count and total / mean time, largest first, then the launches in order, with
their grid and, where the listing has ``launch__registers_per_thread``, their registers."""

import csv
import re
import sys
from collections import defaultdict

# ncu picks the unit of each row's duration
_US = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}


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


if __name__ == "__main__":
    for p in sys.argv[1:]:
        summarize(p)
