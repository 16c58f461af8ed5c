"""``ddtree-numba generate`` through ``cli.main``: ddtree, dflash and ar print the same greedy
tokens on the golden pair; the JSON holds every statistic and they agree with each other; stop
ids, prompt files, the progress hook; and every bad input exits 2 with a one-line message."""

import json
import os

import numpy as np
import pytest

import ddtree_numba as dd
import ddtree_numba.cli as cli
import ddtree_numba.model.loader as loader
from ddtree_numba.decode import STAGES

DATA = os.path.join(os.path.dirname(__file__), "data")
TARGET = os.path.join(DATA, "v3_noaux_tc")
DRAFTER = os.path.join(DATA, "drafters", "dflash_v3_noaux_tc")
PROMPT = [1, 5, 9, 33]
N_NEW = 30


def _run(capsys, *args, method="ddtree", drafter=DRAFTER, prompt="1,5,9,33", extra=()):
    """main([...]) -> (exit status, stdout, stderr)."""
    argv = ["generate", "--target", TARGET, "--prompt-ids", prompt, "--method", method,
            "--max-new-tokens", str(N_NEW), "--backend", "numpy", "--no-progress", *args, *extra]
    if drafter is not None:
        argv += ["--drafter", drafter]
    rc = cli.main(argv)
    out, err = capsys.readouterr()
    return rc, out, err


def _generated(out):
    """The ids on the ``generated (n...): a,b,c`` line."""
    line = next(ln for ln in out.splitlines() if ln.startswith("generated ("))
    return [int(t) for t in line.split(": ", 1)[1].split(",")]


@pytest.fixture(scope="module")
def ar_tokens():
    target = dd.load_target(TARGET, backend="numpy")
    return dd.generate(target, None, np.array(PROMPT, np.int32), N_NEW, method="ar").tokens.tolist()


@pytest.mark.parametrize("method", ["ddtree", "dflash", "ar"])
def test_methods_print_the_greedy_tokens(capsys, method, ar_tokens):
    rc, out, err = _run(capsys, "--budget", "16", method=method)
    assert rc == 0, err
    assert _generated(out) == ar_tokens
    assert f"{method}: {N_NEW} tokens in" in out                       # the summary
    assert "mean acceptance length" in out


def test_ar_needs_no_drafter(capsys, ar_tokens, tmp_path):
    path = tmp_path / "ar.json"
    rc, out, err = _run(capsys, "--json", str(path), method="ar", drafter=None)
    assert rc == 0, err
    assert _generated(out) == ar_tokens
    s = json.loads(path.read_text())
    assert s["drafter"] is None and s["drafter_forwards"] == 0
    assert s["target_forwards"] == s["num_tokens"] == N_NEW
    assert s["acceptance_lengths"] == [1] * s["rounds"] and s["tree_sizes"] == [0] * s["rounds"]


@pytest.mark.parametrize("method", ["ddtree", "dflash"])
def test_json_statistics_are_complete_and_consistent(capsys, tmp_path, method, ar_tokens):
    path = tmp_path / "stats.json"
    rc, out, err = _run(capsys, "--budget", "16", "--json", str(path), method=method)
    assert rc == 0, err
    s = json.loads(path.read_text())
    assert s["method"] == method and s["backend"] == "numpy" and s["budget"] == 16
    assert s["target"] == os.path.abspath(TARGET) and s["drafter"] == os.path.abspath(DRAFTER)
    assert s["prompt_ids"] == PROMPT and s["prompt_len"] == len(PROMPT)
    assert s["tokens"] == ar_tokens == _generated(out) and s["num_tokens"] == N_NEW
    assert not s["stopped"] and s["stop_ids"] == []
    acc, depths, sizes = (np.array(s[k]) for k in ("acceptance_lengths", "accepted_depths", "tree_sizes"))
    r = s["rounds"]
    assert len(acc) == len(depths) == len(sizes) == r == s["target_forwards"] - 1 == s["drafter_forwards"]
    assert (acc >= 1).all() and (depths == acc - 1).all() and (depths <= sizes).all()
    # each round's forward decides acc[r] tokens (its accepted drafts and the next bonus), the
    # prefill one more; the output is those tokens, the last round's possibly cut short
    assert acc.sum() - acc[-1] < s["num_tokens"] <= acc.sum() + 1
    cap = 16 if method == "ddtree" else 5                             # dflash: block_size - 1 depths
    assert (sizes >= 1).all() and (sizes <= cap).all()
    if method == "ddtree":
        assert sizes.max() == 16
    assert s["mean_acceptance_length"] == pytest.approx(acc.mean())
    assert s["forwards_saved"] == s["num_tokens"] - s["target_forwards"]
    assert s["tokens_per_forward"] == pytest.approx(s["num_tokens"] / s["target_forwards"])
    assert set(s["stage_times_s"]) == set(STAGES)
    assert (s["loop"], s["stage_clock"]) == ("host", "host")       # the numpy backend: host wall clock
    assert all(v >= 0 for v in s["stage_times_s"].values())
    assert s["stage_times_s"]["verify"] > 0 and s["stage_times_s"]["draft"] > 0
    assert s["elapsed_s"] >= sum(s["stage_times_s"].values()) > 0
    assert s["tokens_per_s"] == pytest.approx(s["num_tokens"] / s["elapsed_s"])
    assert set(s["load_s"]) == {"target", "drafter"}
    assert s["summary"].splitlines()[0] in out


def test_stop_ids_and_prompt_files(capsys, tmp_path, ar_tokens):
    # the first stop id to appear ends generation there, kept
    first = next(i for i, t in enumerate(ar_tokens) if i >= 3 and t not in ar_tokens[:i])
    stop = ar_tokens[first]
    txt, js = tmp_path / "prompt.txt", tmp_path / "prompt.json"
    txt.write_text(" ".join(map(str, PROMPT[:2])) + "\n" + ",".join(map(str, PROMPT[2:])) + "\n")
    js.write_text(json.dumps(PROMPT))
    for prompt in (str(txt), str(js)):
        rc, out, err = _run(capsys, "--stop-ids", f"{stop}", "95", "--json", str(tmp_path / "s.json"),
                            prompt=prompt)
        assert rc == 0, err
        assert _generated(out) == ar_tokens[:first + 1]
        assert f"ended at stop id {stop}" in out
        s = json.loads((tmp_path / "s.json").read_text())
        assert s["stopped"] and s["stop_ids"] == sorted([stop, 95]) and s["prompt_ids"] == PROMPT


def test_progress_hook_and_bar(capsys):
    seen = []
    target = dd.load_target(TARGET, backend="numpy")
    drafter = dd.load_drafter(DRAFTER, target)
    res = dd.generate(target, drafter, np.array(PROMPT, np.int32), N_NEW, budget=16, progress=seen.append)
    assert seen == sorted(seen) and seen[-1] == N_NEW == len(res.tokens)
    assert len(seen) == len(res.acceptance_lengths) + 1                # every round, and the last bonus
    # with the bar on, stdout still carries just the ids and the summary
    rc = cli.main(["generate", "--target", TARGET, "--drafter", DRAFTER, "--prompt-ids", "1", "5", "9", "33",
                   "--max-new-tokens", str(N_NEW), "--backend", "numpy"])
    out, err = capsys.readouterr()
    assert rc == 0 and _generated(out) == res.tokens.tolist()
    assert "tok" in err                                                 # tqdm wrote to stderr


def _fail(capsys, *args, **kw):
    rc, out, err = _run(capsys, *args, **kw)
    assert rc == 2 and "Traceback" not in err and "generated" not in out
    return err


@pytest.mark.parametrize("kw, args, message", [
    (dict(prompt="1,x,3"), (), "'x' is not an integer token id"),
    (dict(prompt="1,-4"), (), "-4"),
    (dict(prompt="1,500"), (), "token id 500 is out of the target's vocab [0, 96)"),
    (dict(prompt="no_such_prompt.txt"), (), "nor a file of ids"),
    (dict(), ("--stop-ids", "2,q"), "--stop-ids: 'q'"),
    (dict(drafter=None), (), "--method ddtree needs --drafter"),
    (dict(drafter=os.path.join(DATA, "no_such_drafter")), (), "no_such_drafter: no such directory"),
    (dict(), ("--budget", "0"), "--budget must be >= 1"),
    (dict(), ("--max-new-tokens", "-1"), "--max-new-tokens must be >= 0"),
    (dict(), ("--temperature", "-1"), "temperature"),
    (dict(), ("--budget", "ten"), "invalid int value: 'ten'"),
    (dict(), ("--method", "beam"), "invalid choice: 'beam'"),
])
def test_bad_input_exits_2_with_a_message(capsys, kw, args, message):
    assert message in _fail(capsys, *args, **kw)


def test_bad_checkpoints(capsys, tmp_path):
    err = _fail(capsys, extra=("--target", os.path.join(DATA, "no_such_target")))
    assert "--target" in err and "no_such_target: no such directory" in err
    err = _fail(capsys, extra=("--target", str(tmp_path)))             # a directory, no checkpoint
    assert "no config.json" in err
    # the golden drafter reads target layer 2; v3_released has two layers
    err = _fail(capsys, extra=("--target", os.path.join(DATA, "v3_released")))
    assert "--drafter" in err and "target_layer_ids entry 2 is outside the target's 2 layers" in err


def _fake_load_target(real, cuda):
    """load_target whose cuda backend raises BackendUnavailable (cuda=None) or hands back the
    numpy target under the given backend name (a cuda backend that works, as far as the CLI sees)."""
    def load(path, backend="numpy", progress=None, **kw):
        if backend != "cuda":
            return real(path, backend=backend, progress=progress)
        if cuda is None:
            raise loader.BackendUnavailable("backend='cuda' is not available here")
        return cuda(real(path, backend="numpy", progress=progress))
    return load


def _gpu_here(monkeypatch):
    """resolve_backend as on a machine with a GPU: auto and cuda both pick cuda."""
    monkeypatch.setattr(loader, "resolve_backend",
                        lambda b: loader.BackendChoice("numpy" if b == "numpy" else "cuda", "test: a GPU"))


def test_cuda_backend_unavailable_exits_2(capsys, monkeypatch):
    monkeypatch.setattr(loader, "load_target", _fake_load_target(loader.load_target, None))
    _gpu_here(monkeypatch)
    err = _fail(capsys, "--backend", "cuda")
    assert "--backend cuda" in err and "backend='cuda' is not available here" in err


@pytest.mark.skipif(os.environ.get("NUMBA_ENABLE_CUDASIM") == "1", reason="the simulator provides cuda")
def test_cuda_backend_on_this_machine(capsys):
    """No fakes: on a CPU-only machine --backend cuda exits 2 with load_target's message; where
    the cuda backend loads, the command runs (ar: no drafter needed)."""
    try:
        loader.load_target(TARGET, backend="cuda")
    except loader.BackendUnavailable as e:
        err = _fail(capsys, "--backend", "cuda", method="ar", drafter=None)
        assert str(e) in err
    else:
        rc, out, err = _run(capsys, "--backend", "cuda", method="ar", drafter=None)
        assert rc == 0, err


def test_auto_takes_the_gpu_and_a_drafter_that_refuses_it_is_named(capsys, monkeypatch, ar_tokens, tmp_path):
    real = loader.load_target

    class NotNumpy:                  # what the CLI sees as a cuda target, forwarding the rest
        def __init__(self, t):
            self.t = t

        def __getattr__(self, name):
            return getattr(self.t, name)   # backend "numpy" underneath: the host loop runs it

    real_drafter = loader.load_drafter

    def refusing_drafter(path, target):
        if isinstance(target, NotNumpy):
            raise ValueError("this drafter cannot run on that target")
        return real_drafter(path, target)

    _gpu_here(monkeypatch)
    monkeypatch.setattr(loader, "load_drafter", refusing_drafter)
    monkeypatch.setattr(loader, "load_target", _fake_load_target(real, NotNumpy))
    # auto picks the GPU; ar needs no drafter; the JSON says which backend ran
    path = tmp_path / "s.json"
    for backend in ("auto", "cuda"):
        rc, out, err = _run(capsys, "--backend", backend, "--json", str(path), method="ar", drafter=None)
        assert rc == 0 and _generated(out) == ar_tokens, err
        assert json.loads(path.read_text())["backend"] == "cuda"
    # a drafter that cannot run on the chosen backend: exit 2 naming the drafter (no silent fallback)
    for backend in ("auto", "cuda"):
        err = _fail(capsys, "--backend", backend)
        assert "--drafter" in err and "this drafter cannot run on that target" in err


def test_round_still_runs(capsys):
    assert cli.main(["round", "--backend", "numpy", "--vocab", "200"]) == 0
    assert "match the numpy twins" in capsys.readouterr().out


def test_help_returns_zero(capsys):
    assert cli.main(["generate", "--help"]) == 0
    assert "--prompt-ids" in capsys.readouterr().out


def test_precision_is_a_cuda_choice_and_named_when_it_cannot_apply(capsys):
    """--precision picks the cuda target's GEMM arithmetic; on numpy (always float32) it is an
    error that says so, not ignored."""
    rc, out, err = _run(capsys, "--precision", "bf16", method="ar", drafter=None)
    assert rc != 0 and "precision applies to backend='cuda' only" in err
