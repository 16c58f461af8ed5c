"""Compile every kernel of ddtree_numba to PTX for compute capability 9.0 (the H200): the stage
kernels in ``kernels/`` and the glue kernels beside the model and the loop that use them.

The CUDA simulator does no type checking, so this is what catches a kernel that runs in
the simulator but cannot compile for a GPU. Run in a process *without*
NUMBA_ENABLE_CUDASIM (tests/test_kernel_registry.py does that). Every kernel found must
have a signature here: a new kernel without one fails, so none is skipped silently.

A kernel made by a factory (``functools.lru_cache``) is built with the module's ``THREADS``,
unless its entry lists ``(factory_args, signature)`` pairs, one per variant to compile.
"""

import importlib
import pkgutil
import sys
import time

from numba import cuda
from numba.cuda import dispatcher as numba_cuda_dispatcher

import ddtree_numba
import ddtree_numba.kernels as kernels_pkg
from ddtree_numba._device import PARAMS_EARLY

F32_2, U32_2, I32_2 = "float32[:, ::1]", "uint32[:, ::1]", "int32[:, ::1]"
# the quantized GEMM variants: (kind, stored weights, scales, block, scales' storage)
_QUANT_KINDS = (("e4m3", "uint8", "float32[:, :, ::1]", (128, 128), "f32"),
                ("int4", "int32", "float32[:, :, ::1]", (1, 32), "f32"),
                ("int4", "int32", "uint16[:, :, ::1]", (1, 32), "bf16"))
I32_1, F64_1, I16 = "int32[::1]", "float64[::1]", "int16"
_ROWS = f"int64, {I32_1}, {I32_2}, int64, int64"    # kernels.rope._dest_rows_args

def _mla_tiles():
    """Every (scores, pv) tile pair of kernels/mla.py's H200 tables."""
    return [tiles for pair in kernels_pkg.mla._GPU_TILES.values() for table in pair for _, tiles in table]


SIGNATURES = {
    "topk._topk_partial_kernel": [(args, f"void({U32_2}, int64, int64, float64[:, ::1], float64[:, ::1], "
                                         f"uint64[:, ::1], {I32_2}, {I32_1}, {F32_2}, {I32_2})")
                                  for args in ((256, 1, 0, True), (256, 0), (1024, 2), (1024, 2, 0, True), (256, 1, 1),
                                               (512, 1, 2), (512, 1, 3))],
    "topk._topk_merge_kernel": [((1024,), f"void({U32_2}, int64, int64, float64[:, ::1], float64[:, ::1], uint64[:, ::1], "
                                          f"{I32_2}, {F32_2}, {I32_2})")],
    "topk._topk_rows_kernel": [((nper,), f"void({U32_2}, int64, {F32_2}, {I32_2})")
                               for nper in (1, 9, 32)],   # V <= 32, the demo drafter's 264, 1024
    "tree_build._build_tree_kernel": [   # a block a tree: [S, L, K] in, [S, B] out
        f"void(float32[:, :, ::1], int32[:, :, ::1], int64, {I32_1}, {I32_2}, {I32_2}, {I32_2}, {I32_2}, "
        f"float64[:, ::1], {I32_1})"],
    "tree_build._build_tree_warp_kernel": [((redux,), f"void(float32[:, :, ::1], int32[:, :, ::1], int64, {I32_1}, "
                                                     f"{I32_2}, {I32_2}, {I32_2}, {I32_2}, float64[:, ::1], {I32_1})")
                                           for redux in (True, False)],
    "tree_build._build_tree_levels_kernel": [
        ((1024, seed), f"void({F32_2}, {I32_2}, int64, {I32_1}, int64, {I32_1}, {I32_1}, {I32_1}, {I32_1}, {F64_1}, {I32_1}, "
                        f"float64[:, ::1], {I32_2}, {I32_2}, {I32_2}, {I32_2}, {I32_2}, {I32_2}, {I32_2}, "
                        f"float64[:, ::1], {I32_1}, {F64_1})") for seed in (True, False)],
    "visibility._visibility_kernel": [f"void({I32_1}, boolean[:, ::1])"],
    "visibility._visibility_bits_kernel": [f"void({I32_1}, {U32_2})"],
    "visibility._pooled_visibility_bits_kernel": [f"void({I32_1}, {I32_2}, {U32_2})"],
    "accept._sample_post_kernel": [f"void({F32_2}, float64, uint64[::1], {I32_2}, {I32_1})"],
    "accept._round_seed_kernel": [f"void(uint64[::1], {I32_1}, uint64[::1])"],
    "accept._follow_tree_kernel": [f"void({I32_2}, {I32_2}, {I32_1}, {I32_1}, {I32_2}, {I32_2}, {I32_2})"],
    "compact._compact_rows_columns_kernel": [
        f"void({t}[:, :, ::1], {I32_2}, {I32_2}, int64, {t}[:, :, ::1], int64, int64)" for t in ("float32", "uint16")],
    "compact._compact_rows_gather_kernel": [
        f"void({t}[:, ::1], {I32_1}, {I32_1}, {t}[:, ::1])" for t in ("float32", "uint16")],
    "compact._compact_rows_copy_back_kernel": [
        f"void({t}[:, ::1], {I32_1}, {t}[:, ::1])" for t in ("float32", "uint16")],
    "compact._compact_rows_naive_kernel": [f"void(float32[:, ::1], {I32_1}, {I32_1})"],
    # -- the GPU-resident round's glue (decode/device.py) --
    "decode.device._verify_inputs_kernel": [
        f"void({I32_1}, {I32_1}, {I32_1}, {I32_1}, {I32_1}, {I32_1}, {I32_1}, {I32_1}, {I32_1}, {I32_1}, {I32_1})"],
    "decode.device._nonfinite_kernel": [f"void({F32_2}, {I32_1}, int64, {F32_2}, {I32_1}, int64, {I32_1})"],
    "decode.device._after_accept_kernel": [
        f"void({I32_1}, {I32_1}, {I32_1}, {I32_1}, {I32_1}, {I32_1}, {I32_1}, {I32_1}, {I32_1}, int64, {I32_1}, "
        f"float32[:, :, ::1], {I32_1}, {F32_2})"],
    "decode.device._prefill_inputs_kernel": [
        f"void(uint32[::1], {I32_1}, uint64[::1], {I32_1}, {I32_1}, {I32_1}, {I32_1}, {I32_1}, {I32_1}, {I32_2})"],
    "decode.device._prefill_tail_kernel": [
        f"void({I32_1}, {I32_1}, {I32_1}, {I32_1}, float32[:, :, ::1], {I32_1}, {I32_1}, {F32_2})"],
    # -- the batched round's glue (decode/device_batch.py) --
    "decode.device_batch._batch_verify_inputs_kernel": [
        f"void({I32_1}, {I32_2}, {I32_2}, {I32_2}, {I32_1}, {I32_1}, {I32_2}, {I32_2}, {I32_1}, {I32_1}, {I32_1}, "
        f"{I32_1}, {I32_2})"],
    "decode.device_batch._batch_after_accept_kernel": [
        f"void({I32_2}, {I32_2}, {I32_2}, {I32_1}, {I32_1}, {I32_2}, {I32_2}, {I32_2}, {I32_1}, {I32_1}, {I32_2}, "
        f"int64, {I32_1}, {I32_1}, {I32_1}, float32[:, :, ::1], {I32_1}, {F32_2}, boolean)"],
    "decode.device_batch._batch_prefill_inputs_kernel": [
        f"void(uint32[::1], {I32_2}, {I32_1}, {I32_1}, {I32_1}, {I32_1}, uint64[::1], {I32_2}, uint64[::1], {I32_2}, "
        f"{I32_1}, {I32_1}, {I32_1}, {I32_1}, {I32_1}, {I32_2})"],
    "decode.device_batch._batch_prefill_tail_kernel": [
        f"void({I32_1}, {I32_2}, {I32_1}, {I32_1}, {I32_2}, float32[:, :, ::1], {I32_1}, {I32_1}, {F32_2}, boolean)"],
    # -- the drafter's glue (model/cuda_drafter.py) --
    "model.cuda_drafter._draft_batch_meta_kernel": [
        f"void({I32_2}, {I32_1}, {I32_1}, int64, int64, int64, int64, {I32_1}, {I32_2}, {I32_2}, {I32_1})"],
    "model.cuda_drafter._block_tails_kernel": [f"void({F32_2}, int64, int64, {F32_2})"],
    "model.cuda_drafter._draft_meta_kernel": [
        f"void({I32_1}, {I32_1}, {I32_1}, int64, int64, int64, boolean, int64, {I32_1}, {I32_1})"],
    # -- the forward (model) kernels --
    # a destination row rule a job: (mode, row0, sequence table, slot rows, layer row0); rope.PoolRows
    "rms_norm._rms_norm_kernel": [
        ((256, pair), f"void({F32_2}, float32[::1], float32, {F32_2}, {I32_1}, int64, {_ROWS}, "
                      f"float32[::1], {F32_2}, int64, {_ROWS})") for pair in (False, True)],
    "rms_norm._qkv_norm_rope_kernel": [
        ((256,), f"void({q}, {I32_2}, float32[::1], float32[::1], float32, {F64_1}, boolean, int64, int64, "
                 f"float32[:, :, ::1], float32[:, :, ::1], boolean)") for q in (F32_2, "float32[:, :]")],
    "rope._rope_cos_sin_kernel": [
        f"void({p}[::1], {F64_1}, float64, {F32_2}, {F32_2})" for p in ("int32", "int64")],
    "rope._rope_table_kernel": [f"void({F32_2}, {F32_2}, {F32_2}, boolean, {F32_2})"],
    "rope._rope_kernel": [
        f"void({F32_2}, int64, int64, {F32_2}, int64, int64, int64, int64, {I32_1}, {F64_1}, "
        f"float64, boolean, {I32_1}, {_ROWS}, {F32_2}, int64, int64, {F32_2}, int64, int64, int64, {_ROWS})"],
    "embedding._embedding_kernel": [
        ((kind,), f"void({ids}[::1], {w}[:, ::1], {F32_2}, {I32_1})")
        for kind, w in (("f32", "float32"), ("f16", "float16"), ("bf16", "uint16"))
        for ids in ("int32", "int64")],
    # linear: (kind, swiglu, accumulate, grouped, gather, vec, xvec, precision, *tile, block, scales,
    # xraw); the scales (float8, int4) are [Z, N/bo, K/bi] (int4's float32 or bf16 bits), else
    # ``out`` stands in for them; int4 always loads words; xraw as the launches pass it (``_X_RAW``,
    # on, with xvec)
    "linear._mma_kernel": [
        ((kind, swiglu, acc, grouped, gather, kind == "int4" or (kind in ("bf16", "e4m3") and vec), vec, precision,
          *tile, block, scales, vec),
         f"void({F32_2}, int64, {w}[:, :, ::1], {w}[:, :, ::1], {sc}, {sc}, {F32_2}, int64, {I32_1}, {I32_1}, {I32_1})")
        for kind, w, sc, block, scales in _QUANT_KINDS + (
            ("f32", "float32", F32_2, (0, 0), "f32"), ("f16", "float16", F32_2, (0, 0), "f32"),
            ("bf16", "uint16", F32_2, (0, 0), "f32"))
        for precision in ("bf16", "fp32")
        for (swiglu, acc, grouped, gather, vec), tile in (((False, False, False, False, True), (1, 1, 8)),
                                                          ((False, True, False, False, False), (2, 4, 1)),
                                                          ((True, False, False, False, True), (1, 2, 4)),
                                                          ((True, False, True, True, False), (1, 1, 1)),
                                                          ((False, False, True, False, True), (2, 2, 2)))
        # bf16 weights (the models' own) at every flag combination in fp32 (the three-mma path)
        # and two in bf16 (the one-mma path); every other kind at the plain and the gathered SwiGLU
        # combinations in fp32 and the plain one in bf16: the kind changes the loads and the decode,
        # the flags the rest (CI time: each variant is ~2 s of the suite's longest test)
        if (precision == "fp32" and (kind == "bf16" or (swiglu, acc, grouped, gather) in (
                (False, False, False, False), (True, False, True, True))))
        or (swiglu, acc, grouped, gather) == (False, False, False, False)
        or (kind == "bf16" and (swiglu, acc, grouped, gather) == (True, False, True, True))] + [
        # word-loaded activations without ``xraw`` (``_X_RAW = False``: packed to bf16 at once),
        # so that path still compiles: gathered SwiGLU experts in fp32 (hi + lo)
        (("bf16", True, False, True, True, True, True, "fp32", 1, 2, 2, (0, 0), "f32", False),
         f"void({F32_2}, int64, uint16[:, :, ::1], uint16[:, :, ::1], {F32_2}, {F32_2}, {F32_2}, int64, {I32_1}, "
         f"{I32_1}, {I32_1})")],
    # staged: (kind, swiglu, accumulate, grouped, gather, precision, WM, WN, MT, RT, NS, XA, block); NS > 0
    # (the cp.async weight ring; XA: the activations in it too) for bf16 weights only: the experts' gate|up and down
    "linear._staged_kernel": [
        ((kind, swiglu, acc, grouped, gather, precision, *tile, block, scales),
         f"void({F32_2}, int64, {w}[:, :, ::1], {w}[:, :, ::1], {sc}, {sc}, {F32_2}, int64, {I32_1}, {I32_1}, {I32_1})")
        for kind, w, sc, block, scales in _QUANT_KINDS + (("bf16", "uint16", F32_2, (0, 0), "f32"),)
        for precision in ("bf16", "fp32")
        for (swiglu, acc, grouped, gather), tile in (((False, True, False, False), (4, 2, 2, 4, 0, 0)),
                                                     ((True, False, True, True), (2, 4, 2, 2, 0, 0)),
                                                     ((False, False, True, False), (4, 2, 2, 4, 0, 0)),
                                                     ((True, False, True, True), (2, 2, 1, 4, 3, 0)),
                                                     ((False, False, True, False), (2, 2, 1, 4, 3, 0)),
                                                     ((True, False, True, True), (2, 1, 1, 2, 2, 1)))
        if (precision == "fp32" or (swiglu, grouped, gather) == (True, True, True)) and (
            tile[4] == 0 or (kind, precision) == ("bf16", "bf16"))],
    "moe._route_kernel": [((128,), f"void({F32_2}, float32[::1], int64, int64, int64, int64, int64, int64, "
                                   f"float32, {I32_1}, {I32_2}, {F32_2})")],
    "moe._sort_kernel": [((512,), f"void({I32_2}, {F32_2}, {I32_1}, {U32_2}, {I32_2}, {I32_1}, {I32_1}, "
                                  f"float32[::1], {I32_2}, {I32_1}, int64)")],
    "moe._combine_kernel": [((shared, residual), f"void({F32_2}, float32[::1], {I32_2}, {F32_2}, {F32_2}, {I32_1})")
                            for shared in (False, True) for residual in (False, True)],
    # the latent cache: one sequence's [1, S, C] (contiguous), or a pool's layer [slots, S, C] (strided slots)
    "mla._mla_scores_kernel": [
        (tiles, f"void({F32_2}, {F32_2}, {cache}, {cache}, {U32_2}, {I32_1}, {I32_2}, float32, {F32_2})")
        for tiles in sorted({t[0] for t in _mla_tiles()})
        for cache in ("float32[:, :, ::1]", "float32[:, :, :]")],
    "mla._mla_scores_mma_kernel": [   # the H200's tile (MMA_SCORES)
        ((*tile, kernels_pkg.mla._MMA_STEP),
         f"void({F32_2}, {F32_2}, {cache}, {cache}, {U32_2}, {I32_1}, {I32_2}, float32, {F32_2})")
        for _, tile in kernels_pkg.mla._MMA_TILES for cache in ("float32[:, :, ::1]", "float32[:, :, :]")],
    "mla._mla_softmax_kernel": [((128, lanes), f"void({F32_2}, {U32_2}, {I32_1}, {I32_2}, int64, {F32_2}, int32[:, :, ::1])")
                                for _, lanes in kernels_pkg.mla._SOFTMAX_LANES],
    "mla._mla_pv_kernel": [
        (tiles, f"void({F32_2}, {cache}, {I32_1}, {I32_2}, int64, int32[:, :, ::1], float32[:, :, ::1], {F32_2})")
        for tiles in sorted({t[1] for t in _mla_tiles()})
        for cache in ("float32[:, :, ::1]", "float32[:, :, :]")],
    "mla._mla_pv_mma_kernel": [   # the H200's tile (MMA_PV): each launch kind
        ((*kernels_pkg.mla._MMA_PV_TILE, tokens, chunks),
         f"void({F32_2}, {cache}, {U32_2}, {I32_1}, {I32_2}, int64, float32[:, :, ::1], {F32_2})")
        for tokens, chunks in ((1, "all"), (kernels_pkg.mla._MMA_PV_TOKENS, "prefix"), (1, "tail"))
        for cache in ("float32[:, :, ::1]", "float32[:, :, :]")],
    "mla._mla_combine_kernel": [((128, v), f"void(float32[:, :, ::1], {F32_2}, {F32_2}, {I32_1}, {I32_2}, int64, {F32_2})") for v in (1, 4)],
    # (..., has_blk, has_mask, fuse, G): the merge by the splits' last block (fuse), or its own
    # launch; G query heads a key/value head (the demo drafter's 2)
    "gqa._gqa_split_kernel": [
        ((dh, *kernels_pkg.gqa._gpu_tiles(dh), blk, msk, fuse, 2),
         f"void({F32_2}, float32[:, :, ::1], float32[:, :, ::1], {F32_2}, {F32_2}, boolean[:, ::1], {I32_2}, int64, "
         f"int64, float32, float32[:, :, ::1], float32[:, :, ::1], {F32_2}, {I32_1})")
        for dh in (64, 128, 256) for blk, msk, fuse in ((True, False, True), (False, False, True), (False, True, True),
                                                         (True, False, False))] + [
        # a DFlash drafter's q / k / v: column views of one stacked projection (strided rows); its
        # cache one sequence ([1, S_cap, W] contiguous) or a pool's layer ([S, S_cap, W] contiguous)
        ((dh, *tiles, True, False, True, 2),
         f"void(float32[:, :], float32[:, :, ::1], float32[:, :, ::1], float32[:, :], float32[:, :], boolean[:, ::1], "
         f"{I32_2}, int64, int64, float32, float32[:, :, ::1], float32[:, :, ::1], {F32_2}, {I32_1})")
        for dh, tiles in sorted({(dh, kernels_pkg.gqa._gpu_tiles(dh, batched))      # (one sequence; several)
                                 for dh in (32, 64, 128) for batched in (False, True)})] + [
        # other groups: G 1 (no grouping), G 4 (a Qwen3-8B drafter's 32 / 8 heads of 128)
        ((dh, *kernels_pkg.gqa._gpu_tiles(dh), True, False, True, g),
         f"void(float32[:, :], float32[:, :, ::1], float32[:, :, ::1], float32[:, :], float32[:, :], boolean[:, ::1], "
         f"{I32_2}, int64, int64, float32, float32[:, :, ::1], float32[:, :, ::1], {F32_2}, {I32_1})")
        for dh, g in ((32, 1), (128, 4))],
    # (Dh, RW, NW, KT, SPLIT, has_blk, G): the drafter's attention (a DFlash drafter's strided q / k / v
    # views; its cache one sequence or a pool's layer), at the tiles _warp_tiles picks on a GPU of 132
    # SMs for one sequence and for a batch (RW 1 and 8 at 12 warps; 4 warps past 32 dims)
    "gqa._gqa_warp_kernel": [
        ((dh, rw, nw, kernels_pkg.gqa._tiles(dh).KT, kernels_pkg.gqa._tiles(dh).SPLIT, blk, g),
         f"void(float32[:, :], float32[:, :, ::1], float32[:, :, ::1], float32[:, :], float32[:, :], {I32_2}, "
         f"int64, int64, int64, float32, float32[:, :, ::1], float32[:, :, ::1], {F32_2})")
        for dh, rw, nw, blk, g in ((32, 1, 12, True, 2), (32, 8, 12, True, 2), (64, 1, 4, True, 2), (32, 1, 12, False, 1))],
    "gqa._gqa_combine_kernel": [
        f"void(float32[:, :, ::1], float32[:, :, ::1], {I32_1}, int64, boolean, {F32_2})"],
}


def find_kernels():
    """qualified name -> the kernel object (or its factory) for every ``_*_kernel`` of every module
    of the package: ``kernels`` modules by their own name, the others by their dotted path."""
    found = {}
    for info in pkgutil.walk_packages(ddtree_numba.__path__, "ddtree_numba."):
        mod = importlib.import_module(info.name)
        short = info.name.removeprefix("ddtree_numba.kernels.").removeprefix("ddtree_numba.")
        for name, obj in vars(mod).items():
            home = getattr(getattr(obj, "py_func", obj), "__module__", None)    # defined here, not imported
            if not (name.startswith("_") and name.endswith("_kernel")) or home != mod.__name__:
                continue
            found[f"{short}.{name}"] = (mod, obj)
    return found


def variants(name, mod, obj):
    """(python function, signature, launch bounds) triples to compile for one kernel: the bounds
    its dispatcher was made with (they decide the registers a thread may use)."""
    for entry in SIGNATURES.get(name, []):
        args, sig = entry if isinstance(entry, tuple) else (None, entry)
        if hasattr(obj, "cache_info"):  # a factory: by its listed args, else by threads per block
            disp = obj(*args) if args is not None else obj(getattr(mod, "THREADS"))
        else:
            disp = obj
        yield disp.py_func, sig, disp.targetoptions.get("launch_bounds")


# Instructions a kernel's PTX must hold: the tensor-core intrinsics (kernels/_mma.py) really emitted.
INSTRUCTIONS = {name: ("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32", "cvt.rn.bf16x2.f32")
                for name in ("linear._mma_kernel", "linear._staged_kernel", "mla._mla_scores_mma_kernel",
                             "mla._mla_pv_mma_kernel")}


class _H200:
    compute_capability = (9, 0)


class _Codegen:
    """What the cache key reads of a code generator: the H200's (CUDA runtime, cc) stand-in."""

    def magic_tuple(self):
        return ((12, 0), (9, 0))


def fingerprints():
    """For every kernel variant: its on-disk cache key (``_device.cached``'s numba-cuda cache,
    built here without a GPU), as one hash, and the cache file name it would use. Printed as
    ``name index-file key-hash`` lines; run twice, the lines must agree (tests/test_kernel_registry.py)."""
    import hashlib
    import os
    import tempfile
    from ddtree_numba._device import _cache_classes
    os.environ.setdefault("DDTREE_CACHE_DIR", tempfile.mkdtemp())
    cache_class = _cache_classes()
    for name, (mod, obj) in sorted(find_kernels().items()):
        for fn, sig, bounds in variants(name, mod, obj):
            cache = cache_class(fn, {"launch_bounds": bounds})
            key = hashlib.sha256(repr(cache._index_key(sig, _Codegen())).encode()).hexdigest()[:16]
            print(name, cache._impl.filename_base, key)


def _shard(found, shard, shards):
    """The kernels of shard ``shard`` of ``shards``, sorted: whole kernels (a kernel's second
    variant compiles in a third of its first one's time, its device functions typed already), the
    kernels by their number of variants, each to the shard with the fewest so far."""
    load, mine = [0] * shards, []
    for name in sorted(found, key=lambda name: (-len(SIGNATURES.get(name, ())), name)):
        least = load.index(min(load))
        load[least] += max(len(SIGNATURES.get(name, ())), 1)
        if least == shard:
            mine.append(name)
    return sorted(mine)


def main():
    """Compile every variant, or with ``--shard i/n`` those of shard i of n (``_shard``: the test
    runs n shards so that the two CI workers share the ~5 minutes); shard 0 also checks that every
    kernel found has a signature and every signature a kernel."""
    if sys.argv[1:] == ["--fingerprints"]:
        return fingerprints()
    shard, shards = 0, 1
    if sys.argv[1:2] == ["--shard"]:
        shard, shards = map(int, sys.argv[2].split("/"))
    # A kernel that calls a device function compiles it for the *current* device's compute
    # capability; there is none on a CPU-only machine, so name the H200's.
    numba_cuda_dispatcher.get_current_device = lambda: _H200()
    found = find_kernels()
    missing = sorted(set(found) - set(SIGNATURES))
    stale = sorted(set(SIGNATURES) - set(found))
    if shard:
        missing = stale = []
    failed = []
    every = [(name, *v) for name in _shard(found, shard, shards) for v in variants(name, *found[name])]
    for name, fn, sig, bounds in every:
        t0 = time.perf_counter()
        try:
            ptx, _ = cuda.compile_ptx(fn, sig, cc=(9, 0), launch_bounds=bounds)
            # every kernel waits for its predecessors first (PDL, ddtree_numba._device), in 'trigger'
            # mode its parameter words read before (a predicated nanosleep takes them)
            early = ("nanosleep.u32 1; griddepcontrol.wait",) if PARAMS_EARLY else ()
            absent = [i for i in INSTRUCTIONS.get(name, ()) + ("griddepcontrol.wait",) + early if i not in ptx]
            if absent:
                raise AssertionError(f"the PTX lacks {absent}")
            print(f"ok   {name} {sig} ({time.perf_counter() - t0:.1f} s)")   # (the suite's longest test)
        except Exception as exc:  # report every failure, not just the first
            failed.append(name)
            print(f"FAIL {name} {sig}\n{type(exc).__name__}: {exc}")
    for name in missing:
        print(f"FAIL {name}: no signature in tests/compile_ptx.py")
    for name in stale:
        print(f"FAIL {name}: listed but not found")
    sys.exit(1 if failed or missing or stale else 0)


if __name__ == "__main__":
    main()
