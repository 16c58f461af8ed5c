"""What bounds a dense GEMM of few rows: one launch timed at several K, N and tiles (H200).

Usage: python tools/few_row_probe.py [--rows 65] [--workspace 128] [--tiles "T;T;..."]
[--shapes "K,N;K,N"] [--no-chosen]. A tile is ``WM,WN,MT,RT,NS[,XA]`` (the staged kernel) or
``MT,RT,NW`` (the register kernel). Each launch is graph-timed (``benchmarks/gemm.py``'s
``graph_time``: device µs a launch, median of 10 replays of 10 launches) and its output checked bit
for bit against the first tile's (the batch-invariance contract: every tile gives the same bits;
"DIFF" marks one that does not). A tile the plan changes (it does not fit, say) is shown with the
tile that ran. With torch installed, ``F.linear`` in bf16 is timed beside it (the peer).
``--no-chosen`` leaves out the tile the rule chooses (for Nsight Compute's ``-c 1``).

Twentieth session (docs/PERFORMANCE.md): at 65 rows the time grows in proportion to K on a fixed
grid (q_proj 7.6 / 12.3 / 21.8 µs at K 512 / 1024 / 2048), and neither more warps splitting the
chunks nor two chunks' chains interleaved in a warp shortened it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _common import random_bf16  # noqa: E402
from gemm import graph_time, torch_time  # noqa: E402


def torch_peer_us(rows, K, N, groups=1):
    """The peer, graph-timed µs a launch: torch's bf16 ``F.linear`` of rows x K by N x K, or with
    ``groups`` > 1 its ``bmm`` of [groups, rows, K] by [groups, K, N] (random operands)."""
    import torch
    if groups > 1:
        tx = torch.randn(groups, rows, K, device="cuda", dtype=torch.bfloat16)
        tw = torch.randn(groups, K, N, device="cuda", dtype=torch.bfloat16)
        return torch_time(lambda: torch.bmm(tx, tw))
    tx = torch.randn(rows, K, device="cuda", dtype=torch.bfloat16)
    tw = torch.randn(N, K, device="cuda", dtype=torch.bfloat16)
    return torch_time(lambda: torch.nn.functional.linear(tx, tw))


def parse_tile(L, text):
    v = tuple(int(a) for a in text.split(","))
    return L._Tile(*v) if len(v) == 3 else L._Staged(*v)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=65)
    ap.add_argument("--workspace", type=int, default=128)
    ap.add_argument("--groups", type=int, default=1,
                    help="Z > 1: per-group projections (MLA's absorptions): x [R, Z*K], w [Z, N, K], out [R, Z*N]")
    ap.add_argument("--no-chosen", action="store_true", help="time the given tiles only (the first is the bits' reference)")
    ap.add_argument("--shapes", default="2048,3072;1024,3072;512,3072;2048,1536;2048,2048;2816,2048")
    ap.add_argument("--tiles", default="4,1,1,2,2;2,1,1,2,2;1,1,1,2,2;4,1,1,1,2;2,1,1,1,2;1,1,1,1,2;"
                                       "1,2,8;2,2,4;1,4,8;2,4,4")
    a = ap.parse_args()
    from numba import cuda

    import importlib
    L = importlib.import_module("ddtree_numba.kernels.linear")
    st = cuda.stream()
    n_rows = cuda.to_device(np.array([a.rows], np.int32), stream=st)
    tiles = [parse_tile(L, t) for t in a.tiles.split(";")]
    try:
        import torch
    except ImportError:
        torch = None
    rng = np.random.default_rng(0)
    print(f"rows {a.rows} in a {a.workspace}-row workspace; µs a launch (graph)")
    print("K,N".ljust(12) + ("" if a.no_chosen else "chosen".rjust(10)) + "".join(str(tuple(t)).rjust(24) for t in tiles)
          + ("torch".rjust(10) if torch else ""))
    for shape in a.shapes.split(";"):
        K, N = (int(v) for v in shape.split(","))
        Z = a.groups
        w = random_bf16((Z * N, K), 0.05, K * 7 + N, st).reshape(Z, N, K)
        x = cuda.to_device(rng.standard_normal((a.workspace, Z * K)).astype(np.float32), stream=st)
        x_gs, o_gs = (K, N) if Z > 1 else (0, 0)
        ref = None
        cols = []
        for tile in ([] if a.no_chosen else [None]) + tiles:
            out = cuda.device_array((a.workspace, Z * N), np.float32, stream=st)

            def fn(tile=tile, out=out):
                L._launch(x, x_gs, w, None, out, o_gs, n_rows, None, None, a.workspace, False, "bf16", st, tile)
            fn()
            got = out.copy_to_host(stream=st)
            st.synchronize()
            got = got[:a.rows]
            if ref is None:
                ref = got
            same = np.array_equal(got.view(np.uint32), ref.view(np.uint32))
            us = graph_time(fn, st)
            plan = L._plan(x, x_gs, w, None, a.workspace, "bf16", tile).tile
            moved = tile is not None and tuple(plan) != tuple(tile)     # the plan changed the tile
            cols.append(f"{us:7.1f}{'' if same else ' DIFF'}{' (plan ' + str(tuple(plan)) + ')' if moved else ''}")
        widths = [24] * len(cols) if a.no_chosen else [10] + [24] * len(tiles)
        line = f"{K},{N}".ljust(12) + "".join(c.rjust(wd) for c, wd in zip(cols, widths))
        if torch:
            line += f"{torch_peer_us(a.rows, K, N, Z):10.1f}"
        print(line, flush=True)


if __name__ == "__main__":
    main()
