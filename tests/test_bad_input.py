"""Bad input, category by category: nothing silently wrong, no traceback or out-of-memory where a
named error belongs, one rule for the API and the command line.

Most cases below failed on the code before issue 12 (it loaded and computed, died with a
MemoryError or a bare exception, or printed a traceback); a few hold behaviour that was already
right and must stay so (``backend="cuda"`` without a GPU). The other modules test the same
mechanisms more narrowly (test_model_checkpoint: the safetensors header, unread tensors, non-finite
weights; test_drafter: drafter configs; test_cli: the generate command)."""

import json
import os
import shutil
import warnings

import numpy as np
import pytest

import ddtree_numba as dd
import ddtree_numba.cli as cli
from ddtree_numba.model import ModelConfig, NumpyTarget, random_drafter, random_target

DATA = os.path.join(os.path.dirname(__file__), "data")
TARGET = os.path.join(DATA, "v3_noaux_tc")
DRAFTER = os.path.join(DATA, "drafters", "dflash_v3_noaux_tc")
PROMPT = np.array([1, 5, 9, 33], np.int32)


@pytest.fixture(scope="module")
def pair():
    target = dd.load_target(TARGET)
    return target, dd.load_drafter(DRAFTER, target)


def _cli(capsys, argv):
    """main(argv) -> (status, stderr); a failure is one line, never a traceback."""
    rc = cli.main(argv)
    out, err = capsys.readouterr()
    if rc:
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    return rc, err


# -- silently wrong ------------------------------------------------------------------------------

def _copy(tmp_path, src, name="ck"):
    dst = tmp_path / name
    shutil.copytree(src, dst)
    return dst


def test_a_truncated_checkpoint_names_its_file(tmp_path):
    d = _copy(tmp_path, TARGET)
    f = d / "model.safetensors"
    f.write_bytes(f.read_bytes()[:-100])
    with pytest.raises(ValueError, match=r"model\.safetensors: the tensors end at byte \d+ of the data section, which "
                                         r"holds \d+ bytes \(the file is truncated\)"):
        dd.load_target(d)


def test_a_config_with_fewer_layers_than_the_weights_is_refused(tmp_path):
    d = _copy(tmp_path, TARGET)
    cfg = json.loads((d / "config.json").read_text())
    cfg["num_hidden_layers"] = 2
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"holds tensor model\.layers\.2\.input_layernorm\.weight .*which the config "
                                         r"does not read"):
        dd.load_target(d)


def _overflowing_target(layer):
    """A random target whose decoder layer ``layer`` overflows float32 (every o_proj weight 3e38:
    its sums are infinite)."""
    t = random_target(ModelConfig.tiny(num_hidden_layers=3, first_k_dense_replace=1), seed=1)
    t.layers[layer].o_proj = np.full_like(t.layers[layer].o_proj, 3e38)
    return t


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning",
                            "ignore:invalid value encountered:RuntimeWarning")
@pytest.mark.parametrize("layer", [0, 2])
def test_non_finite_logits_name_the_first_layer_that_went_non_finite(layer):
    t = _overflowing_target(layer)
    with pytest.raises(ValueError, match=rf"target forward: the logits are not finite .*the output of its layer "
                                         rf"{layer} is the first"):
        t.forward(np.array([1, 2, 3], np.int32), np.arange(3, dtype=np.int32), t.new_cache(4))
    with pytest.raises(ValueError, match=rf"layer {layer} is the first"):          # through generate too
        dd.generate(t, None, np.array([1, 2], np.int32), 3, method="ar")


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning",
                            "ignore:invalid value encountered:RuntimeWarning")
def test_non_finite_drafter_output_names_the_drafter_and_its_layer():
    t = random_target(ModelConfig.tiny(), seed=1)
    d = random_drafter(t, num_hidden_layers=2)
    d.w["layers.1.self_attn.o_proj.weight"] = np.full_like(d.w["layers.1.self_attn.o_proj.weight"], 3e38)
    with pytest.raises(ValueError, match=r"drafter forward: the hidden state is not finite .*its layer 1 is the first"):
        dd.generate(t, d, np.array([1, 2], np.int32), 6, budget=4)


def test_a_context_past_max_position_embeddings_is_refused_unless_allowed(pair):
    target, drafter = pair                                  # max_position_embeddings 256
    limit = target.config.max_position_embeddings
    with pytest.raises(ValueError, match=rf"= {limit + 1} positions exceed the target's max_position_embeddings "
                                         rf"\({limit}\); pass allow_long_context=True"):
        dd.generate(target, drafter, PROMPT, limit + 1 - len(PROMPT))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = dd.generate(target, None, PROMPT, 2, method="ar", max_tokens=limit + 8, allow_long_context=True)
        assert res.tokens.shape == (2,) and not caught                    # within the limit: no warning
        dd.generate(target, None, PROMPT, limit, method="ar", allow_long_context=True)
    assert any("past what the target was trained for" in str(w.message) for w in caught)


@pytest.mark.parametrize("stops, words", [
    ("12", "stop_token_ids must be a sequence of token ids, got '12'"),     # was split into '1', '2'
    (7, "stop_token_ids must be a sequence"),
    ([3, 96], "stop_token_ids entry must be <= 95, got 96"),
    ([3, -1], "stop_token_ids entry must be >= 0"),
    ([1.5], "stop_token_ids entry must be an integer"),
    (np.array(10), "stop_token_ids must be a sequence"),                   # a 0-d array: not iterable
])
def test_stop_token_ids_are_token_ids(pair, stops, words):
    target, drafter = pair
    with pytest.raises(ValueError, match=words):
        dd.generate(target, drafter, PROMPT, 4, stop_token_ids=stops)


@pytest.mark.parametrize("change, words", [
    (dict(hidden_act="gelu"), "hidden_act 'gelu' is not supported"),
    (dict(mlp_bias=True), "mlp_bias = true is not supported"),
    (dict(use_sliding_window=True), "sliding-window layers are not supported"),
    (dict(layer_types=["full_attention", "sliding_attention"]), "sliding-window layers"),
    (dict(vocab_size=97), "vocab_size=97 disagrees with the target's 96"),
    (dict(num_target_layers=5), "num_target_layers=5 disagrees with the target's 3"),
])
def test_drafter_config_fields_that_contradict_the_drafter_are_refused(tmp_path, pair, change, words):
    d = _copy(tmp_path, DRAFTER)
    cfg = json.loads((d / "config.json").read_text())
    cfg.update(change)
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=words):
        dd.load_drafter(d, pair[0])


def test_a_drafter_config_with_fewer_layers_than_its_weights_is_refused(tmp_path, pair):
    d = _copy(tmp_path, DRAFTER)
    cfg = json.loads((d / "config.json").read_text())
    cfg["num_hidden_layers"] = 1
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"drafter checkpoint holds tensor layers\.1\..*which its config does not read"):
        dd.load_drafter(d, pair[0])
    (d / "config.json").write_text("{oops")
    with pytest.raises(ValueError, match=r"config\.json is not valid JSON"):
        dd.load_drafter(d, pair[0])
    (d / "config.json").unlink()
    with pytest.raises(ValueError, match="no config.json at .*/ck/config.json"):
        dd.load_drafter(d, pair[0])


def test_a_tensor_stored_in_two_shards_is_refused(tmp_path):
    d = _copy(tmp_path, os.path.join(DATA, "v3_released"))
    index = json.loads((d / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    from test_model_checkpoint import _raw_header, _write_raw
    first, data = _raw_header(d / shards[0])
    second, data2 = _raw_header(d / shards[1])
    name = next(iter(k for k in first if k != "__metadata__"))
    second[name] = dict(first[name], data_offsets=[len(data2), len(data2) + first[name]["data_offsets"][1]
                                                   - first[name]["data_offsets"][0]])
    _write_raw(d / shards[1], second, data2 + data[first[name]["data_offsets"][0]:first[name]["data_offsets"][1]])
    with pytest.raises(ValueError, match=rf"tensor {name} is stored twice"):
        dd.load_target(d)


def test_float16_storage_refuses_what_it_cannot_hold(tmp_path):
    from ddtree_numba.dtypes import to_storage
    with pytest.raises(ValueError, match="beyond float16's range"):
        to_storage(np.array([[1.0, 7e4]], np.float32), "float16")
    assert to_storage(np.array([[1.0, 7e4]], np.float32), "bfloat16").dtype == np.uint16


def test_a_non_finite_drafter_weight_is_named(tmp_path, pair):
    from test_model_checkpoint import _rewrite

    def poison(t):
        w = t["layers.0.self_attn.q_norm.weight"].copy()           # bf16 words
        w[0] = 0x7FC0                                              # a bf16 NaN
        t["layers.0.self_attn.q_norm.weight"] = w
    d = _rewrite(DRAFTER, tmp_path / "d", poison)
    with pytest.raises(ValueError, match=r"tensor layers\.0\.self_attn\.q_norm\.weight holds 1 non-finite"):
        dd.load_drafter(d, pair[0])


# -- sizes checked before anything is allocated ----------------------------------------------------

@pytest.mark.parametrize("kw", [dict(max_new_tokens=10**9), dict(max_new_tokens=8, budget=10**9)])
def test_huge_sizes_are_a_named_error_not_a_memory_error(pair, kw):
    target, drafter = pair
    kw = dict(kw)
    n = kw.pop("max_new_tokens")
    with pytest.raises(ValueError, match=r"need at least [\d.]+ GiB; the numpy backend has [\d.]+ GiB available"), \
            warnings.catch_warnings():
        warnings.simplefilter("ignore")                            # (allow_long_context warns first)
        dd.generate(target, drafter, PROMPT, n, allow_long_context=True, **kw)


# -- one rule for the API and the command line ---------------------------------------------------

def test_budget_zero_is_refused_by_both(pair, capsys):
    target, drafter = pair
    with pytest.raises(ValueError, match="budget must be >= 1, got 0"):
        dd.generate(target, drafter, PROMPT, 4, budget=0)
    rc, err = _cli(capsys, ["generate", "--target", TARGET, "--drafter", DRAFTER, "--prompt-ids", "1,2",
                            "--budget", "0", "--backend", "numpy", "--no-progress"])
    assert rc == 2 and "--budget must be >= 1" in err


def test_backend_auto_is_taken_by_both(capsys):
    t = dd.load_target(TARGET, backend="auto")          # the simulator is for tests: auto runs numpy
    assert isinstance(t, NumpyTarget)
    rc, err = _cli(capsys, ["generate", "--target", TARGET, "--prompt-ids", "1,2", "--method", "ar",
                            "--max-new-tokens", "2", "--backend", "auto", "--no-progress"])
    assert rc == 0


def test_progress_true_is_a_bar_and_anything_else_is_refused(pair, capsys):
    target, drafter = pair
    res = dd.generate(target, drafter, PROMPT, 6, progress=True)
    assert res.tokens.shape == (6,)
    with pytest.raises(ValueError, match="progress must be True, False, None or a callable, got 'yes'"):
        dd.generate(target, drafter, PROMPT, 6, progress="yes")


# -- the command line: one line and exit 2 -------------------------------------------------------

@pytest.mark.parametrize("argv, words", [
    (["round", "--budget", "-3", "--backend", "numpy"], "budget must be >= 1, got -3"),
    (["round", "--vocab", "2", "--backend", "numpy"], "vocab must be >= 4, got 2"),
    (["round", "--depths", "0", "--backend", "numpy"], "depths must be >= 1, got 0"),
    (["round", "--vocab", "2000000000", "--backend", "numpy"], "vocab must be <= 1048576"),
    (["round", "--depths", "100000000", "--backend", "numpy"], "depths must be <= 32"),
    (["round", "--budget", "2000000000", "--backend", "numpy"], "budget must be <= 1024"),
    (["round", "--budget", "abc"], "argument --budget: invalid int value: 'abc' (see ddtree-numba round --help)"),
    (["generate", "--target", TARGET, "--prompt-ids", "1", "--method", "ar", "--json", "/nonexistent/x.json"],
     "--json /nonexistent/x.json: cannot write a file there (checked before the run starts)"),
    (["generate", "--target", TARGET, "--prompt-ids", "1", "--method", "ar", "--max-new-tokens", "300"],
     "exceed the target's max_position_embeddings (256)"),
    (["generate", "--target", TARGET, "--prompt-ids", "1", "--method", "ar", "--stop-ids", "96"],
     "--stop-ids: token id 96 is out of the target's vocab"),
])
def test_cli_errors_are_one_line(capsys, argv, words):
    rc, err = _cli(capsys, argv + (["--no-progress"] if argv[0] == "generate" else []))
    assert rc == 2 and words in err, err


def test_cli_json_to_a_read_only_file_is_refused_before_the_run(capsys, tmp_path):
    path = tmp_path / "stats.json"
    path.write_text("{}")
    path.chmod(0o444)
    if os.access(path, os.W_OK):
        pytest.skip("running as a user who can write read-only files (root)")
    rc, err = _cli(capsys, ["generate", "--target", TARGET, "--prompt-ids", "1", "--method", "ar", "--json",
                            str(path), "--no-progress"])
    assert rc == 2 and "cannot write a file there" in err


def test_cli_round_with_cuda_where_there_is_none(capsys, monkeypatch):
    from numba import config as numba_config
    from numba import cuda
    monkeypatch.setattr(numba_config, "ENABLE_CUDASIM", False)
    monkeypatch.setattr(cuda, "is_available", lambda: False)
    rc, err = _cli(capsys, ["round", "--backend", "cuda"])
    assert rc == 2 and "needs a CUDA GPU and none was found" in err


def test_cli_plot_keeps_the_files_of_a_directory_that_has_some(capsys, tmp_path):
    stats = os.path.join(os.path.dirname(DATA), "..", "figures", "data", "sweep_numpy.json")
    out = tmp_path / "figs"
    out.mkdir()
    (out / "mine.png").write_bytes(b"x")
    rc, err = _cli(capsys, ["plot", stats, "--out", str(out)])
    assert rc == 2 and "is not empty" in err and "--overwrite" in err
    assert (out / "mine.png").read_bytes() == b"x"


# -- the forty-fifth session's audit: silent or late answers that now name the problem --------------

def test_a_drafter_loaded_for_another_target_is_refused(pair):
    target, drafter = pair
    other = random_target(ModelConfig.tiny(vocab_size=target.config.vocab_size, hidden_size=48), seed=3)
    with pytest.raises(ValueError, match="drafter was loaded for another target"):
        dd.generate(other, drafter, PROMPT, 2)
    dd.generate(dd.load_target(TARGET), drafter, PROMPT, 2)     # the same checkpoint loaded twice: fine


@pytest.mark.parametrize("target, words", [(None, "target must be a loaded model"),
                                           (TARGET, "dd.load_target")])
def test_a_path_or_none_where_a_target_belongs_is_named(pair, target, words):
    with pytest.raises(ValueError, match=words):
        dd.generate(target, pair[1], PROMPT, 2)
    with pytest.raises(ValueError, match="dd.load_drafter"):
        dd.generate(pair[0], DRAFTER, PROMPT, 2)


@pytest.mark.parametrize("prompt", ["hello", b"hello"])
def test_a_text_prompt_says_to_encode_it(pair, prompt):
    with pytest.raises(ValueError, match=r"token ids.*list\(text.encode\(\)\)"):
        dd.generate(*pair, prompt, 2)


@pytest.mark.parametrize("kw, words", [(dict(graph="junk"), "graph must be"), (dict(trace="no"), "trace must be"),
                                       (dict(graph=True), "is for the GPU-resident loop"),
                                       (dict(allow_long_context=1), "allow_long_context must be"),
                                       (dict(temperature=1e-300), "use 0 for greedy")])
def test_generate_flags_are_checked(pair, kw, words):
    with pytest.raises(ValueError, match=words):
        dd.generate(*pair, PROMPT, 2, **kw)


def test_sweeps_check_every_prompt_before_decoding(pair):
    from ddtree_numba import stats
    target, drafter = pair
    vocab = target.config.vocab_size
    for prompts, words in (([PROMPT, [vocab]], f"prompt 1: prompt token id {vocab} is out of range"),
                           ([[1.5, 2.0]], "prompt 0: prompt_ids must hold integers"),
                           ([np.array([2**32 + 1, 2], np.int64)], "prompt 0: prompt token id 4294967297 is out of range"),
                           (list(PROMPT), "prompts is a list of prompts"),
                           (["hello"], r"prompt 0: prompt_ids must be token ids.*list\(text.encode\(\)\)"),
                           ([{"module": "m"}], "prompt 0 is a dict without 'ids'"),
                           ("hello", "must be a list of prompts")):
        for sweep in (stats.acceptance_sweep, stats.batch_sweep):
            with pytest.raises(ValueError, match=words):
                sweep(target, drafter, prompts, max_new_tokens=2, budgets=(2,))
    with pytest.raises(ValueError, match="example_budget"):
        stats.acceptance_sweep(target, drafter, [PROMPT], 2, budgets=(2,), example_budget=1.5)
    with pytest.raises(ValueError, match="max_new_tokens"):
        stats.batch_sweep(target, drafter, [PROMPT], max_new_tokens=0, budgets=(2,))
    with pytest.raises(ValueError, match="budgets"):
        stats.acceptance_sweep(target, drafter, [PROMPT], 2, budgets=(True,))
    for kw, words in ((dict(progress="no"), "progress must be"), (dict(warmup=1), "warmup must be")):
        for sweep in (stats.acceptance_sweep, stats.batch_sweep):
            with pytest.raises(ValueError, match=words):
                sweep(target, drafter, [PROMPT], max_new_tokens=2, budgets=(2,), **kw)
    with pytest.raises(ValueError, match="graph must be"):
        stats.acceptance_sweep(target, drafter, [PROMPT], 2, budgets=(2,), graph="junk")


def test_statistics_readers_refuse_what_is_not_in_the_sweep():
    from ddtree_numba import stats
    path = os.path.join(os.path.dirname(DATA), "..", "figures", "data", "sweep_numpy.json")
    with open(path) as f:
        sweep = json.load(f)
    for call, words in ((lambda: stats.pooled_lengths(sweep, "DDTree", 64), "method must be one of"),
                        (lambda: stats.pooled_lengths(sweep, "dflash", 64), "budget is for ddtree only"),
                        (lambda: stats.depth_survival(sweep, "dflsh"), "method must be one of"),
                        (lambda: stats.depth_survival(sweep, "dflash", depths=-2), "depths"),
                        (lambda: stats.acceptance_histogram(sweep, "dflash", max_length=0), "max_length"),
                        (lambda: stats.check_stats(dict(sweep, runs=None)), "'runs' must be a list"),
                        (lambda: stats.check_stats(dict(sweep, budgets="16")), "'budgets' must be a list"),
                        (lambda: stats.projected_tokens_per_s(sweep, {"nodes": [17, 65], "ms": [float("nan"), -2.0]}),
                         "finite, > 0")):
        with pytest.raises(ValueError, match=words):
            call()


def test_tree_inputs_refuse_negative_ids_and_take_minus_infinity_quietly():
    from ddtree_numba import reference as ref
    lp = np.array([[0.0, -1.0, -np.inf], [-0.5, -np.inf, -np.inf]], np.float32)
    ids = np.array([[3, 1, 2], [0, 1, 2]], np.int32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")                   # (np.diff of -inf entries warned)
        ref.build_tree(lp, ids, 4)
    with pytest.raises(ValueError, match="ids must be token ids >= 0"):
        ref.build_tree(lp, -ids - 1, 4)


def test_summary_file_plot_out_and_example_nodes_are_named(pair, capsys, tmp_path):
    from ddtree_numba import plots
    res = dd.generate(*pair, PROMPT, 2)
    with pytest.raises(ValueError, match="file must be a writable stream"):
        res.summary(file="stderr")
    stats = os.path.join(os.path.dirname(DATA), "..", "figures", "data", "sweep_numpy.json")
    (tmp_path / "f").write_text("x")
    rc, err = _cli(capsys, ["plot", stats, "--out", str(tmp_path / "f")])
    assert rc == 2 and "is a file, not a directory" in err
    with open(stats) as f:
        example = json.load(f)["examples"][0]
    with pytest.raises(ValueError, match="max_nodes"):
        plots.example_tree(example, max_nodes=-3)


@pytest.mark.parametrize("kw, words", [(dict(hidden_size=32.5), "hidden_size must be an integer"),
                                       (dict(vocab_size="96"), "vocab_size must be an integer"),
                                       (dict(rope_theta=float("inf")), "rope_theta must be positive and finite"),
                                       (dict(hidden=32), "no field hidden")])
def test_config_presets_and_replace_check_types_as_config_json_does(kw, words):
    with pytest.raises(ValueError, match=words):
        ModelConfig.tiny(**kw)
    with pytest.raises(ValueError, match=words):
        ModelConfig.tiny().replace(**kw)
