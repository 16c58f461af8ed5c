"""generate() on the cuda backend: greedy DDTree and the DFlash chain equal greedy autoregressive
decoding token for token, with the cuda target (and the cuda DFlash drafter), and equal the numpy
backend's tokens.

The simulator runs a few rounds of one golden checkpoint; on a GPU the same checks run on every
golden checkpoint with longer generations.
"""

import os

import numpy as np
import pytest

import ddtree_numba as dd
from ddtree_numba.model.cuda_drafter import CudaDrafter

from conftest import REAL_GPU
from test_decode import NoisyOracle, _prompt

pytestmark = pytest.mark.kernels

DATA = os.path.join(os.path.dirname(__file__), "data")
CHECKPOINTS = ["v3_noaux_tc", "v2_greedy_f16", "kimi_fp8", "v3_bf16_tied", "v3_neox_yarn_nolora"] \
    if REAL_GPU else ["v3_noaux_tc"]
N_NEW = 40 if REAL_GPU else 4
# The simulator spends ~20 s on a forward: there, one DDTree run against the numpy backend's
# tokens (prefill + two rounds); the rest on a GPU.
METHODS = [("ddtree", 8), ("dflash", 0)] if REAL_GPU else [("ddtree", 8)]


@pytest.mark.parametrize("name", CHECKPOINTS)
def test_greedy_ddtree_on_cuda_equals_autoregressive_on_both_backends(name):
    path = os.path.join(DATA, name)
    host, gpu = dd.load_target(path), dd.load_target(path, backend="cuda")
    prompt = _prompt(1, host.config.vocab_size, n=5)
    want = dd.generate(host, None, prompt, N_NEW, method="ar").tokens          # numpy backend
    if REAL_GPU:
        np.testing.assert_array_equal(dd.generate(gpu, None, prompt, N_NEW, method="ar").tokens, want)
    seq = np.concatenate([prompt, want]).astype(np.int32)
    feats = host.forward(seq, np.arange(len(seq), dtype=np.int32), host.new_cache(len(seq)),
                         hidden_layer_ids=(0, 1)).hidden                       # [P + n, 2, M]
    lengths = []
    for method, budget in METHODS:
        oracle = NoisyOracle(seq, feats, host.config.vocab_size, 0.9 if not REAL_GPU else 0.7, seed=3)
        res = dd.generate(gpu, oracle, prompt, N_NEW, method=method, budget=budget)
        np.testing.assert_array_equal(res.tokens, want, err_msg=f"{name} {method}")
        lengths += res.acceptance_lengths.tolist()
    assert max(lengths) >= 3, lengths                  # multi-token acceptance was exercised


@pytest.mark.gpu
def test_the_golden_drafter_runs_on_cuda_and_drives_ddtree_to_the_ar_tokens():
    path = os.path.join(DATA, "v3_noaux_tc")
    gpu = dd.load_target(path, backend="cuda")
    drafter = dd.load_drafter(os.path.join(DATA, "drafters", "dflash_v3_noaux_tc"), gpu)
    assert isinstance(drafter, CudaDrafter)
    prompt = _prompt(2, 96, n=5)
    ar = dd.generate(gpu, None, prompt, N_NEW, method="ar").tokens
    res = dd.generate(gpu, drafter, prompt, N_NEW, method="ddtree", budget=8)
    np.testing.assert_array_equal(res.tokens, ar)
    assert res.drafter_forwards == len(res.acceptance_lengths) > 0
