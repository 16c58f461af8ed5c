"""tools/train_demo.py --smoke: the package reads what it writes, the numpy forward agrees with the
torch target on it, and ddtree / dflash decoding of the smoke pair equals ar. Also demo_pair().

The smoke run needs torch and transformers >= 5 (the 'train' / 'goldens' extras) and is skipped
without them; the demo_pair tests need neither."""

import json
import os
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


def test_demo_pair_names_the_training_command_when_missing(tmp_path, monkeypatch):
    monkeypatch.setattr(demo, "DEMO_DIR", str(tmp_path / "nowhere"))
    with pytest.raises(FileNotFoundError, match="tools/train_demo.py"):
        dd.demo_pair()
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


def test_drafter_stage_without_a_target_stage_says_so(tmp_path):
    _needs_training_stack()
    proc = subprocess.run([sys.executable, SCRIPT, "--smoke", "--device", "cpu", "--out", str(tmp_path),
                           "--stage", "drafter"], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode != 0 and "--stage target" in proc.stderr
