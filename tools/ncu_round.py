"""Per-kernel device times of one round from Nsight Compute CSVs (``tools/h200_ab.sh``
PART=stages), side by side: each kernel's name, grid, registers and µs, and each file's total.

Usage: python tools/ncu_round.py ncu_old.csv [ncu_new.csv ...]
"""

from __future__ import annotations

import csv
import sys


_US = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}


def load(path: str) -> list[dict]:
    """The kernels of one CSV in launch order: name, grid, registers, us."""
    rows: dict[str, dict] = {}
    with open(path) as f:
        for r in csv.DictReader(line for line in f if line.startswith('"')):
            k = rows.setdefault(r["ID"], {"name": r["Kernel Name"].split("[")[0].split("(")[0],
                                          "grid": r["Grid Size"], "regs": 0, "us": 0.0})
            value = float(r["Metric Value"].replace(",", ""))
            if r["Metric Name"] == "gpu__time_duration.sum":     # ncu picks the unit a row
                k["us"] = value * _US[r["Metric Unit"]]
            elif r["Metric Name"] == "launch__registers_per_thread":
                k["regs"] = int(value)
    return list(rows.values())


def main(paths: list[str]) -> None:
    for path in paths:
        kernels = load(path)
        print(f"{path}: {len(kernels)} kernels, {sum(k['us'] for k in kernels):.1f} µs")
        for i, k in enumerate(kernels):
            print(f"{i:4d} {k['name'][-44:]:<44} {k['grid']:<14} {k['regs']:>4} {k['us']:8.1f}")


if __name__ == "__main__":
    main(sys.argv[1:])
