"""tools/train_demo.py --smoke: the package reads what it writes, the numpy forward agrees with the
torch target on it, and ddtree / dflash decoding of the smoke pair equals ar. Also demo_pair().

The smoke run needs torch and transformers >= 5 (the 'train' / 'goldens' extras) and is skipped
without them; the demo_pair tests need neither."""

import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest

import ddtree_numba as dd
from ddtree_numba import demo
from ddtree_numba.model.checkpoint import SafetensorsIndex

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "tools", "train_demo.py")
MASK = 259


def _needs_training_stack():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    if int(transformers.__version__.split(".")[0]) < 5:
        pytest.skip(f"tools/train_demo.py needs transformers >= 5, found {transformers.__version__}")
    if not hasattr(transformers, "DeepseekV3ForCausalLM"):
        pytest.skip("transformers has no DeepseekV3ForCausalLM")
    return torch, transformers


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    _needs_training_stack()
    out = tmp_path_factory.mktemp("demo")
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, SCRIPT, "--smoke", "--device", "cpu", "--out", str(out)],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    seconds = time.perf_counter() - t0
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    with open(out / "demo.json") as f:
        meta = json.load(f)
    return out, meta, seconds


def test_smoke_run_writes_the_pair_and_its_card(smoke):
    out, meta, seconds = smoke
    for sub in ("target", "drafter"):
        assert (out / sub / "config.json").is_file() and (out / sub / "model.safetensors").is_file()
    card = (out / "MODEL_CARD.md").read_text()
    for needle in ("## Data", "## Target", "## Drafter", "held-out loss", "Python", "## Acceptance"):
        assert needle in card
    assert meta["data"]["heldout_modules"] and meta["data"]["python_version"]
    assert meta["check"]["passed"] and meta["check"]["ddtree_equals_ar"]
    assert np.isfinite(meta["eval"]["target_heldout_loss"]) and np.isfinite(meta["eval"]["drafter"]["loss"])
    assert meta["training"]["target"]["steps"] > 0 and meta["training"]["drafter"]["steps"] > 0
    assert sum(meta["bytes"].values()) <= 30_000_000
    held = set(meta["data"]["heldout_modules"])
    assert meta["prompts"] and all(p["module"] in held for p in meta["prompts"])
    assert seconds < 300, f"the smoke run took {seconds:.0f} s"


def test_weights_are_stored_bf16_routers_f32(smoke):
    out, _, _ = smoke
    for sub in ("target", "drafter"):
        index = SafetensorsIndex(str(out / sub))
        for name, (_, entry, _) in index.entries.items():
            router = name.endswith("mlp.gate.weight") or name.endswith("e_score_correction_bias")
            assert entry["dtype"] == ("F32" if router else "BF16"), name


def test_the_package_loads_the_pair_and_matches_torch(smoke):
    torch, transformers = _needs_training_stack()
    out, meta, _ = smoke
    target = dd.load_target(out / "target")
    drafter = dd.load_drafter(out / "drafter", target)
    assert target.config.vocab_size == 264 and drafter.mask_token_id == MASK and drafter.block_size == 16
    assert target.config.first_k_dense_replace == 1 and target.config.scoring_func == "sigmoid"
    assert target.config.topk_method == "noaux_tc" and target.config.n_shared_experts >= 1
    ids = np.asarray(meta["prompts"][0]["ids"][:10], np.int64)
    got = target.forward(ids, np.arange(len(ids)), target.new_cache(len(ids))).logits
    hf = transformers.DeepseekV3ForCausalLM.from_pretrained(str(out / "target"), dtype=torch.float32).eval()
    with torch.no_grad():
        ref = hf(input_ids=torch.tensor(ids)[None], use_cache=False).logits[0].numpy()
    np.testing.assert_allclose(got, ref, rtol=1e-3, atol=1e-3 * np.abs(ref).max())
    assert (got.argmax(-1) == ref.argmax(-1)).mean() >= 0.9


@pytest.mark.parametrize("method", ["ddtree", "dflash"])
def test_speculative_decoding_of_the_pair_equals_ar(smoke, method):
    out, meta, _ = smoke
    target = dd.load_target(out / "target")
    drafter = dd.load_drafter(out / "drafter", target)
    prompt = np.asarray(meta["prompts"][-1]["ids"], np.int32)
    ar = dd.generate(target, None, prompt, 20, method="ar")
    spec = dd.generate(target, drafter, prompt, 20, method=method, budget=12)
    np.testing.assert_array_equal(spec.tokens, ar.tokens)
    assert spec.target_forwards <= ar.target_forwards


def test_demo_pair_finds_a_written_pair(smoke):
    out, _, _ = smoke
    t, d = demo.demo_pair(out)
    assert t == os.path.join(str(out), "target") and d == os.path.join(str(out), "drafter")
    assert demo.demo_metadata(out)["specials"]["mask"] == MASK


def test_demo_pair_names_the_training_command_when_missing(tmp_path):
    with pytest.raises(FileNotFoundError, match="tools/train_demo.py"):
        dd.demo_pair(tmp_path / "nowhere")
    (tmp_path / "half" / "target").mkdir(parents=True)
    (tmp_path / "half" / "target" / "config.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match="drafter/config.json"):
        demo.demo_pair(tmp_path / "half")


def test_two_stage_run_writes_the_same_pair(smoke, tmp_path):
    """--stage target then --stage drafter (for machines that cap one command's time) gives the
    one-run pair bit for bit: the drafter stage reads the target back as stored."""
    _needs_training_stack()
    out, meta, _ = smoke
    for stage in ("target", "drafter"):
        proc = subprocess.run([sys.executable, SCRIPT, "--smoke", "--device", "cpu", "--out", str(tmp_path),
                               "--stage", stage], capture_output=True, text=True, timeout=600, cwd=ROOT)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        if stage == "target":
            assert (tmp_path / "target_stage.json").is_file() and not (tmp_path / "drafter").exists()
    assert not (tmp_path / "target_stage.json").exists()        # folded into demo.json
    for sub in ("target", "drafter"):
        assert (tmp_path / sub / "model.safetensors").read_bytes() == (out / sub / "model.safetensors").read_bytes()
    staged = json.loads((tmp_path / "demo.json").read_text())
    assert staged["check"]["passed"] and "--stage target, then" in staged["repeat_command"]
    assert staged["eval"]["target_heldout_loss"] == meta["eval"]["target_heldout_loss"]


def test_drafter_stage_refuses_other_data_flags(smoke, tmp_path):
    """The drafter stage's held-out split and dtype must be the target stage's."""
    _needs_training_stack()
    run = [sys.executable, SCRIPT, "--smoke", "--device", "cpu", "--out", str(tmp_path), "--no-check"]
    assert subprocess.run(run + ["--stage", "target"], capture_output=True, timeout=600, cwd=ROOT).returncode == 0
    proc = subprocess.run(run + ["--stage", "drafter", "--heldout-mod", "8"], capture_output=True, text=True,
                          timeout=600, cwd=ROOT)
    assert proc.returncode != 0 and "heldout_mod=16 there, 8 here" in proc.stderr


def test_drafter_stage_without_a_target_stage_says_so(tmp_path):
    _needs_training_stack()
    proc = subprocess.run([sys.executable, SCRIPT, "--smoke", "--device", "cpu", "--out", str(tmp_path),
                           "--stage", "drafter"], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode != 0 and "--stage target" in proc.stderr



def test_warm_start_continues_the_drafter_it_reads(smoke, tmp_path):
    """--init-drafter: the weights read are the smoke run's (their held-out metrics before this run
    equal that run's own evaluation, to the last bit), this run's steps add to its count and its
    commands chain; a drafter of another shape is refused, the field named, before any work."""
    _needs_training_stack()
    out, meta, _ = smoke
    shutil.copytree(out, tmp_path / "pair")
    pair = tmp_path / "pair"
    run = [sys.executable, SCRIPT, "--smoke", "--device", "cpu", "--out", str(pair), "--stage", "drafter",
           "--no-check", "--init-drafter", str(pair / "drafter"), "--drafter-steps", "3", "--drafter-lr", "3e-4",
           "--drafter-warmup", "1"]
    proc = subprocess.run(run, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    warm = json.loads((pair / "demo.json").read_text())
    dr = warm["training"]["drafter"]
    assert dr["warm_start"]["heldout_before"] == meta["eval"]["drafter"]
    assert dr["warm_start"]["same_target"] is True
    assert dr["total_steps"] == meta["training"]["drafter"]["steps"] + 3
    assert warm["repeat_command"].startswith(meta["repeat_command"] + ", then ")
    assert warm["preset"]["d_lr"] == 3e-4 and "Warm-started" in (pair / "MODEL_CARD.md").read_text()

    config = json.loads((out / "drafter" / "config.json").read_text())
    config["num_key_value_heads"] += 1
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "config.json").write_text(json.dumps(config))
    shutil.copy(out / "drafter" / "model.safetensors", tmp_path / "other")
    run[run.index("--init-drafter") + 1] = str(tmp_path / "other")
    proc = subprocess.run(run, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode != 0 and "num_key_value_heads" in proc.stderr and "target:" not in proc.stdout
    proc = subprocess.run([sys.executable, SCRIPT, "--smoke", "--device", "cpu", "--out", str(tmp_path / "t"),
                           "--stage", "target", "--init-drafter", str(pair / "drafter")],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode != 0 and "--init-drafter needs --stage drafter" in proc.stderr

# ----------------------------------------------------------------------------------------------
# the shipped pair (ddtree_numba/data/demo) and the committed statistics (figures/)
# ----------------------------------------------------------------------------------------------
FIGURES = os.path.join(ROOT, "figures")


@pytest.fixture(scope="module")
def shipped():
    meta = demo.demo_metadata()
    t_dir, d_dir = dd.demo_pair()
    target = dd.load_target(t_dir, progress=False)
    return meta, target, dd.load_drafter(d_dir, target)


def test_the_shipped_pair_is_what_the_card_says(shipped):
    meta, target, drafter = shipped
    cfg = target.config
    assert cfg.model_type == "deepseek_v3" and cfg.vocab_size == 264 and cfg.kv_lora_rank > 0
    assert cfg.first_k_dense_replace == 1 and cfg.scoring_func == "sigmoid" and cfg.topk_method == "noaux_tc"
    assert cfg.n_shared_experts >= 1 and cfg.n_routed_experts > cfg.num_experts_per_tok
    assert drafter.block_size == 16 and drafter.mask_token_id == MASK
    assert 1e6 < meta["target"]["params"] < 3e7
    assert sum(meta["bytes"].values()) <= 30_000_000
    for sub in ("target", "drafter"):
        index = SafetensorsIndex(os.path.join(demo.DEMO_DIR, sub))
        assert {e["dtype"] for _, e, _ in index.entries.values()} <= {"BF16", "F32"}
    held = set(meta["data"]["heldout_modules"])
    assert len(meta["prompts"]) >= 3 and all(p["module"] in held for p in meta["prompts"])
    assert meta["check"]["passed"]
    card = open(os.path.join(demo.DEMO_DIR, "MODEL_CARD.md")).read()
    assert f"{meta['eval']['target_heldout_loss']:.4f}" in card and "| ddtree | 1024 |" in card


def test_the_shipped_pair_decodes_exactly_and_accepts(shipped):
    """Real weights, real acceptance: greedy ddtree == ar on a held-out prompt, with several
    drafted tokens accepted per round (random weights give about 1)."""
    meta, target, drafter = shipped
    prompt = np.asarray(meta["prompts"][2]["ids"], np.int32)
    ar = dd.generate(target, None, prompt, 32, method="ar")
    tree = dd.generate(target, drafter, prompt, 32, method="ddtree", budget=32)
    np.testing.assert_array_equal(tree.tokens, ar.tokens)
    assert tree.mean_acceptance_length >= 2.5, tree.summary(file=None)


def test_the_committed_statistics_hold_the_claims():
    """figures/data/sweep_numpy.json: every run exact; DDTree beats the chain at every budget and
    reaches >= 3 tokens per target forward; figures/README.md captions every committed PNG."""
    from ddtree_numba import stats
    with open(os.path.join(FIGURES, "data", "sweep_numpy.json")) as f:
        s = json.load(f)
    stats.check(s)
    assert s["budgets"] == [16, 32, 64, 128, 256, 512, 1024] and len(s["prompts"]) >= 8
    rows = stats.summary_rows(s)
    chain = next(r for r in rows if r["method"] == "dflash")
    tree = [r for r in rows if r["method"] == "ddtree"]
    assert all(r["mean_acceptance"] > chain["mean_acceptance"] for r in tree)
    assert stats.best_row(s)["tokens_per_forward"] >= 3.0
    assert demo.demo_metadata()["acceptance"]["best_budget"] == stats.best_row(s)["budget"]
    pngs = sorted(f for f in os.listdir(FIGURES) if f.endswith(".png"))
    readme = open(os.path.join(FIGURES, "README.md")).read()
    assert len(pngs) >= 5 and all(f"![{p}]({p})" in readme for p in pngs)
    assert "ddtree-numba plot" in readme


def test_the_readme_table_is_the_committed_sweep():
    """README's acceptance table gives the numbers of figures/data/sweep_numpy.json."""
    from ddtree_numba import stats
    with open(os.path.join(FIGURES, "data", "sweep_numpy.json")) as f:
        rows = stats.summary_rows(json.load(f))
    chain = next(r for r in rows if r["method"] == "dflash")
    tree = [r for r in rows if r["method"] == "ddtree"]
    readme = open(os.path.join(ROOT, "README.md")).read()
    for label, key in (("mean acceptance length", "mean_acceptance"), ("tokens per target forward", "tokens_per_forward")):
        line = next(ln for ln in readme.splitlines() if ln.startswith(f"| {label} |"))
        cells = [c.strip().strip("*") for c in line.strip("|").split("|")[1:]]
        assert cells == [f"{r[key]:.2f}" for r in [chain] + tree], label
