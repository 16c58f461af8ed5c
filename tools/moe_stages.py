"""Time the MoE block's launches one by one at the Moonlight-16B-A3B shape, on a GPU.

Usage (a GPU machine): python tools/moe_stages.py [--rows 1 17 65 272 1040] [--repeat 10]

A two-layer Moonlight-shape target with random bf16 weights (benchmarks/verify_forward.py's
``build_target``; layer 1 is an MoE layer: 64 routed experts, top-6, two shared). For each row
count (272 = 16 trees of 17 nodes, a batch of ``benchmarks/batch.py``; 1040 = 16 trees of 65) the
post-attention input is random, so the routing is close to uniform, as with random weights in
batch.py. Each launch of ``kernels.moe._moe_block_launches`` (and the whole block) is repeated
``--repeat`` times in one captured CUDA graph (``tune_tiles.timed``); the table gives µs a launch
and the routed experts that got rows, the whole block in line and with its shared experts on a
side stream (``enqueue_moe_block(concurrent=True)``), beside the block's bytes floor (the touched experts'
weights and the shared experts' once, bf16, at 4.2 TB/s). Prints a markdown table.

``--tiles MT,RT,NW ...``: also time the two routed-expert GEMMs under each forced register tile
(``kernels.linear._Tile``; four or five numbers WM,WN,MT,RT[,NS] force the staged kernel's
``_Staged``, NS its cp.async weight ring; tiles never change the bits, and each forced tile's
expert outputs are compared with the chosen tile's bit for bit) beside the chosen one; ``--router-tiles`` the same for the router GEMM
(fp32, 64 x 2048), ``--shared-tiles`` for the shared experts' two GEMMs. ``--profile``: for
Nsight Compute, e.g. ``ncu --profile-from-start off --clock-control none --section SpeedOfLight
--section Occupancy --section WarpStateStats python tools/moe_stages.py --rows 65 --profile``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 17, 65, 272, 1040])
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--tiles", nargs="*", default=[],
                    help="forced expert tiles, MT,RT,NW (register) or WM,WN,MT,RT[,NS[,XA]] (staged) each")
    ap.add_argument("--router-tiles", nargs="*", default=[], help="forced router tiles, MT,RT,NW each")
    ap.add_argument("--shared-tiles", nargs="*", default=[], help="forced shared-expert tiles")
    ap.add_argument("--profile", action="store_true",
                    help="no timing: run each block once more between cuda.profile_start / stop, for "
                         "ncu --profile-from-start off (eager launches, in the table's order)")
    ap.add_argument("--no-x-raw", action="store_true",
                    help="the register GEMM kernel packs activations at their loads (kernels.linear._X_RAW off)")
    args = ap.parse_args()
    from numba import cuda
    if args.no_x_raw:                            # the module (kernels.linear is also the launcher's name)
        import importlib
        importlib.import_module("ddtree_numba.kernels.linear")._X_RAW = False
    from tune_tiles import timed
    from verify_forward import MOONLIGHT, build_target
    from ddtree_numba.kernels.linear import _Staged, _Tile, _rows_a_tile, enqueue_linear, _enqueue_swiglu
    from ddtree_numba.kernels.moe import (ROUTER_PRECISION, _expert_launches, _moe_block_launches, enqueue_moe_block,
                                          _enqueue_moe_sort)
    from ddtree_numba.model.config import ModelConfig

    def parse(spec):
        numbers = [int(v) for v in spec.split(",")]
        return _Tile(*numbers) if len(numbers) == 3 else _Staged(*numbers)

    cfg = ModelConfig.from_dict(dict(MOONLIGHT, num_hidden_layers=2))
    target = build_target(cfg, "bf16")
    lw = target.layers[1]
    M, I, E = cfg.hidden_size, cfg.moe_intermediate_size, cfg.n_routed_experts
    expert_bytes = 3 * M * I * 2
    shared_bytes = cfg.n_shared_experts * expert_bytes
    rng = np.random.default_rng(0)
    names, table = None, []
    for rows in args.rows:
        ws = target.workspace(rows)
        ws.meta.copy_to_device(np.array([0, rows], np.int32))
        normed = np.zeros((ws.rows, M), np.float32)
        normed[:rows] = rng.standard_normal((rows, M))
        ws.normed.copy_to_device(normed)
        block = dict(gate=lw.gate, bias=lw.e_score_correction_bias, experts_gate=lw.experts_gate_proj,
                     experts_up=lw.experts_up_proj, experts_down=lw.experts_down_proj,
                     shared_gate=lw.shared_gate_proj, shared_up=lw.shared_up_proj,
                     shared_down=lw.shared_down_proj, route=target._route, bufs=ws.moe, n_rows=ws.n_rows,
                     **target.gemm_args)
        launches = lambda s: _moe_block_launches(ws.normed, ws.x, **block, stream=s)
        names = [n for n, _ in launches(0)]
        for _, go in launches(0):
            go()
        offsets = ws.moe.offsets.copy_to_host()
        touched = int((np.diff(offsets[:E + 1]) > 0).sum())
        slots = int(offsets[E])
        chosen_out = ws.moe.expert_out.copy_to_host()[:slots]     # the bits every forced tile must give
        if args.profile:
            cuda.synchronize()
            cuda.profile_start()
            for _, go in launches(0):
                go()
            cuda.synchronize()
            for spec in args.tiles:           # then each forced tile's two expert GEMMs
                tile = parse(spec)
                _enqueue_moe_sort(ws.moe.topk_ids, ws.moe.topk_weights, ws.moe, ws.n_rows,
                                  item_rows=_rows_a_tile(tile))
                for _, go in _expert_launches(ws.normed, lw.experts_gate_proj, lw.experts_up_proj,
                                              lw.experts_down_proj, ws.moe, target.gemm_args["precision"], tile, 0):
                    go()
            cuda.synchronize()
            cuda.profile_stop()
            print(f"{rows} rows: {touched} experts with rows; profiled {', '.join(names)}, then the expert GEMMs "
                  f"of tiles {args.tiles}")
            continue
        us = [timed(lambda s, i=i: launches(s)[i][1](), args.repeat) for i in range(len(names))]
        whole = timed(lambda s: [go() for _, go in launches(s)], args.repeat)
        side = timed(lambda s: enqueue_moe_block(ws.normed, ws.x, **block, concurrent=True, stream=s), args.repeat)
        floor = (touched * expert_bytes + shared_bytes) / 4.2e12 * 1e6
        table.append((rows, touched, us, whole, side, floor))
        for spec in args.tiles:
            tile = parse(spec)
            # work items as tall as the forced tile's rows, as the block would sort them for it
            _enqueue_moe_sort(ws.moe.topk_ids, ws.moe.topk_weights, ws.moe, ws.n_rows, item_rows=_rows_a_tile(tile))
            forced = lambda s: _expert_launches(ws.normed, lw.experts_gate_proj, lw.experts_up_proj,
                                                lw.experts_down_proj, ws.moe, target.gemm_args["precision"], tile, s)
            ws.moe.expert_out.copy_to_device(np.full(ws.moe.expert_out.shape, np.nan, np.float32))
            for _, go in forced(0):
                go()
            same = np.array_equal(ws.moe.expert_out.copy_to_host()[:slots].view(np.uint32), chosen_out.view(np.uint32))
            t_us = [timed(lambda s, i=i: forced(s)[i][1](), args.repeat) for i in range(2)]
            print(f"{rows} rows, expert tile {tuple(tile)} (items of {_rows_a_tile(tile)} rows): gate|up "
                  f"{t_us[0]:.1f} µs, down {t_us[1]:.1f} µs (chosen: {us[names.index('experts gate|up')]:.1f}, "
                  f"{us[names.index('experts down')]:.1f}); bits {'==' if same else '!= (WRONG)'} the chosen tile's")
        for spec in args.router_tiles:
            tile = parse(spec)
            r_us = timed(lambda s: enqueue_linear(ws.normed, lw.gate, ws.moe.logits, ws.n_rows,
                                                  precision=ROUTER_PRECISION, tile=tile, stream=s), args.repeat)
            print(f"{rows} rows, router tile {tuple(tile)}: {r_us:.1f} µs (chosen: {us[names.index('router')]:.1f})")
        precision = target.gemm_args["precision"]
        for spec in args.shared_tiles:
            tile = parse(spec)
            shared = [lambda s: _enqueue_swiglu(ws.normed, lw.shared_gate_proj, lw.shared_up_proj, ws.moe.shared_act,
                                                ws.n_rows, precision=precision, tile=tile, stream=s),
                      lambda s: enqueue_linear(ws.moe.shared_act, lw.shared_down_proj, ws.moe.shared_out, ws.n_rows,
                                               precision=precision, tile=tile, stream=s)]
            t_us = [timed(go, args.repeat) for go in shared]
            print(f"{rows} rows, shared tile {tuple(tile)}: gate|up {t_us[0]:.1f} µs, down {t_us[1]:.1f} µs "
                  f"(chosen: {us[names.index('shared gate|up')]:.1f}, {us[names.index('shared down')]:.1f})")
    if args.profile:
        return
    print(f"\nMoE block, Moonlight shape (M {M}, {E} experts of {I}, top-{cfg.num_experts_per_tok}, "
          f"{cfg.n_shared_experts} shared), µs a launch")
    print("| rows | experts with rows | " + " | ".join(names) + " | whole | whole, shared on a side stream | "
          "bytes floor |")
    print("|---" * (len(names) + 5) + "|")
    for rows, touched, us, whole, side, floor in table:
        print(f"| {rows} | {touched} | " + " | ".join(f"{u:.1f}" for u in us)
              + f" | {whole:.1f} | {side:.1f} | {floor:.1f} |")


if __name__ == "__main__":
    main()
