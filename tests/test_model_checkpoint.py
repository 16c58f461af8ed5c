"""Checkpoint loading: the safetensors reader, bf16 widening, fp8 block dequantization against
hand-computed values, shards, the ignored MTP layer, and every way a checkpoint can be wrong."""

import json
import os
import re
import shutil

import numpy as np
import pytest
from safetensors.numpy import save_file

import ddtree_numba as dd
from ddtree_numba.model.checkpoint import (
    SafetensorsIndex, dequant_fp8_block, load_weights, read_header)
from ddtree_numba.dtypes import bf16_to_float32, e4m3_to_float32
from ddtree_numba.model import ModelConfig

DATA = os.path.join(os.path.dirname(__file__), "data")


def test_bf16_words_widen_exactly():
    words = np.array([0x3F80, 0xC000, 0x3FC0, 0x0000, 0x8000, 0x7F80, 0xFF80, 0x4049, 0x0001], np.uint16)
    want = [1.0, -2.0, 1.5, 0.0, -0.0, np.inf, -np.inf, 3.140625, 2.0 ** -133]
    got = bf16_to_float32(words)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, np.array(want, np.float32))
    assert np.signbit(got[4])


def test_e4m3_bytes_decode_by_hand():
    # sign | exponent (4 bits, bias 7) | mantissa (3 bits); no infinities; 0x7f / 0xff are NaN
    cases = {0x00: 0.0, 0x38: 1.0, 0x40: 2.0, 0xB8: -1.0, 0x3C: 1.5, 0x30: 0.5, 0x7E: 448.0,
             0xFE: -448.0, 0x08: 2.0 ** -6, 0x01: 2.0 ** -9, 0x07: 7 * 2.0 ** -9, 0x77: 240.0}
    raw = np.array(list(cases), np.uint8)
    np.testing.assert_array_equal(e4m3_to_float32(raw), np.array(list(cases.values()), np.float32))
    assert np.isnan(e4m3_to_float32(np.array([0x7F, 0xFF], np.uint8))).all()


def test_fp8_block_dequant_with_128x128_blocks_and_ragged_edges():
    raw = np.full((130, 260), 0x38, np.uint8)                  # every weight 1.0 before scaling
    raw[128, 200] = 0x3C                                        # 1.5
    raw[3, 257] = 0xC0                                          # -2.0
    scale = np.array([[1, 2, 3], [4, 5, 6]], np.float32)       # [ceil(130/128), ceil(260/128)]
    w = dequant_fp8_block(raw, scale, (128, 128))
    assert w.shape == (130, 260) and w.dtype == np.float32
    assert w[0, 0] == 1 and w[127, 127] == 1 and w[0, 128] == 2 and w[127, 255] == 2
    assert w[0, 256] == 3 and w[129, 259] == 6 and w[128, 0] == 4 and w[129, 130] == 5
    assert w[128, 200] == 1.5 * 5 and w[3, 257] == -2.0 * 3
    with pytest.raises(ValueError, match="needs"):
        dequant_fp8_block(raw, scale[:, :2], (128, 128))


def test_reader_agrees_with_the_safetensors_package(tmp_path):
    rng = np.random.default_rng(0)
    tensors = {"a": rng.standard_normal((3, 5)).astype(np.float32),
               "b": rng.standard_normal((7,)).astype(np.float16),
               "c": np.arange(6, dtype=np.int64).reshape(2, 3)}
    save_file(tensors, str(tmp_path / "x.safetensors"), metadata={"format": "np"})
    index = SafetensorsIndex(str(tmp_path))
    for name, t in tensors.items():
        got, _ = index.raw(name)
        np.testing.assert_array_equal(got, t)
        assert got.dtype == t.dtype
    header, offset = read_header(str(tmp_path / "x.safetensors"))
    assert set(header) == set(tensors) and offset > 8


def test_bf16_checkpoint_loads_the_stored_words(tmp_path):
    """A bf16 golden: every weight is exactly representable in bf16 after loading."""
    _, w = load_weights(os.path.join(DATA, "v3_bf16_tied"))
    x = w["model.layers.0.self_attn.kv_b_proj.weight"]
    assert x.dtype == np.float32
    assert (x.view(np.uint32) & 0xFFFF == 0).all()


def test_fp8_golden_matches_a_hand_dequantization():
    path = os.path.join(DATA, "kimi_fp8")
    index = SafetensorsIndex(path)
    name = "model.layers.1.self_attn.q_b_proj.weight"           # [64, 24] in 16 x 16 blocks
    raw, dtype = index.raw(name)
    scale, _ = index.raw(name + "_scale_inv")
    assert dtype == "F8_E4M3" and raw.shape == (64, 24) and scale.shape == (4, 2)
    _, w = load_weights(path)
    for i, j in [(0, 0), (15, 15), (16, 0), (63, 23), (40, 17)]:
        assert w[name][i, j] == e4m3_to_float32(raw[i:i + 1, j])[0] * scale[i // 16, j // 16]


def test_fp8_kept_as_stored_is_the_same_weights():
    """read_checkpoint(keep_fp8=True) returns the fp8 matrices as BlockScaled (what the GPU keeps):
    dequantized they are the float32 weights, and a numpy target built from them is the same."""
    from ddtree_numba.dtypes import BlockScaled
    from ddtree_numba.model.checkpoint import read_checkpoint
    path = os.path.join(DATA, "kimi_fp8")
    _, kept, _ = read_checkpoint(path, keep_fp8=True)
    _, plain, _ = read_checkpoint(path)
    fp8 = [n for n, w in kept.items() if isinstance(w, BlockScaled)]
    assert "model.layers.1.self_attn.q_b_proj.weight" in fp8 and "model.norm.weight" not in fp8
    for n in fp8:
        assert kept[n].block == (16, 16) and kept[n].data.dtype == np.uint8
        np.testing.assert_array_equal(kept[n].dequantize(), plain[n])
    from ddtree_numba.model.target import NumpyTarget
    a, b = NumpyTarget(*read_checkpoint(path, keep_fp8=True)[:2]), NumpyTarget(*read_checkpoint(path)[:2])
    np.testing.assert_array_equal(a.layers[1].experts_down_proj, b.layers[1].experts_down_proj)


@pytest.mark.parametrize("nope,block", [(128, (128, 64)), (8, (16, 16))])
def test_fp8_absorption_weights_stay_block_scaled_when_blocks_align(nope, block):
    """kv_b_proj [H*(D+Dv), C] in fp8: W_uk^T and W_uv keep their bytes when blocks do not
    straddle heads (transposed blocks for W_uk^T), else they are dequantized; the same values."""
    from ddtree_numba.dtypes import BlockScaled
    from ddtree_numba.reference.mla import absorption_weights
    rng = np.random.default_rng(1)
    h, dv, c = 2, nope, 96
    raw = rng.integers(0, 0x70, (h * (nope + dv), c)).astype(np.uint8)
    scale = rng.random((-(-h * (nope + dv) // block[0]), -(-c // block[1]))).astype(np.float32) + 0.5
    w = BlockScaled(raw, scale, block)
    want = absorption_weights(w.dequantize(), h, nope)
    got = absorption_weights(w, h, nope)
    aligned = nope % block[0] == 0
    for g, x in zip(got, want):
        assert isinstance(g, BlockScaled) == aligned
        np.testing.assert_array_equal(g.dequantize() if aligned else g, x)
    if aligned:
        assert got[0].block == block[::-1] and got[1].block == block


def test_sharded_checkpoint_with_an_mtp_layer_loads_without_it():
    path = os.path.join(DATA, "v3_released")
    index = SafetensorsIndex(path)
    cfg, w = load_weights(path)
    assert any(n.startswith(f"model.layers.{cfg.num_hidden_layers}.") for n in index.entries)
    assert not any(n.startswith(f"model.layers.{cfg.num_hidden_layers}.") for n in w)
    assert len({index.entries[n][0] for n in index.entries}) == 2


def test_progress_bar(capsys):
    load_weights(os.path.join(DATA, "v3_noaux_tc"), progress=True)
    assert "loading v3_noaux_tc" in capsys.readouterr().err


# -- broken checkpoints -------------------------------------------------------------------------

def _rewrite(src, dst, edit_tensors=None, edit_config=None):
    """Copy a golden single-file checkpoint, editing its (float32) tensors or config."""
    os.makedirs(dst, exist_ok=True)
    with open(os.path.join(src, "config.json")) as f:
        config = json.load(f)
    if edit_config:
        edit_config(config)
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(config, f)
    index = SafetensorsIndex(src)
    raw = {n: index.raw(n) for n in index.entries}
    tensors = {n: r[0] for n, r in raw.items()}
    if edit_tensors:
        edit_tensors(tensors)
    out = os.path.join(dst, "model.safetensors")
    save_file(tensors, out)
    # safetensors.numpy writes bf16 / fp8 words as U16 / U8: put the stored dtype back
    for name in tensors:
        if raw.get(name, (None, ""))[1] in ("BF16", "F8_E4M3"):
            _set_dtype(out, name, raw[name][1])
    return dst


SRC = os.path.join(DATA, "v3_noaux_tc")


def test_missing_tensor_is_named(tmp_path):
    path = _rewrite(SRC, tmp_path / "ck", lambda t: t.pop("model.layers.2.mlp.experts.5.up_proj.weight"))
    with pytest.raises(ValueError, match=r"missing tensor model\.layers\.2\.mlp\.experts\.5\.up_proj\.weight"):
        dd.load_target(path)


def test_missing_router_bias_is_named(tmp_path):
    path = _rewrite(SRC, tmp_path / "ck", lambda t: t.pop("model.layers.1.mlp.gate.e_score_correction_bias"))
    with pytest.raises(ValueError, match="e_score_correction_bias"):
        dd.load_target(path)


def test_shape_mismatch_is_named(tmp_path):
    def cut(t):
        t["model.layers.1.self_attn.kv_b_proj.weight"] = t["model.layers.1.self_attn.kv_b_proj.weight"][:-1]
    path = _rewrite(SRC, tmp_path / "ck", cut)
    with pytest.raises(ValueError, match=r"kv_b_proj\.weight has shape \[63, 16\]"):
        dd.load_target(path)


def test_config_disagreeing_with_the_tensors_is_named(tmp_path):
    path = _rewrite(SRC, tmp_path / "ck", edit_config=lambda c: c.update(kv_lora_rank=12))
    with pytest.raises(ValueError, match="kv_a_proj_with_mqa.weight has shape"):
        dd.load_target(path)


def test_fp8_weight_without_scales(tmp_path):
    src = os.path.join(DATA, "kimi_fp8")
    path = _rewrite(src, tmp_path / "ck", lambda t: t.pop("model.layers.0.self_attn.o_proj.weight_scale_inv"))
    with pytest.raises(ValueError, match=r"o_proj\.weight has no block scales"):
        dd.load_target(path)


def _raw_header(path):
    """(header with __metadata__, data bytes), read without any check (the file may be bad)."""
    blob = open(path, "rb").read()
    n = int.from_bytes(blob[:8], "little")
    return json.loads(blob[8:8 + n]), blob[8 + n:]


def _write_raw(path, header, data):
    text = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little") + text + data)


def _set_dtype(path, name, dtype):
    header, data = _raw_header(path)
    header[name]["dtype"] = dtype
    _write_raw(path, header, data)


def test_non_float_weight_and_unknown_dtype(tmp_path):
    path = _rewrite(SRC, tmp_path / "ck")
    p = os.path.join(path, "model.safetensors")
    _set_dtype(p, "model.norm.weight", "I32")
    with pytest.raises(ValueError, match=r"model\.norm\.weight has dtype I32"):
        dd.load_target(path)
    _set_dtype(p, "model.norm.weight", "F8_E5M2")               # 1 byte an element: 128 bytes are not 32 of them
    with pytest.raises(ValueError, match=r"model\.norm\.weight: 128 bytes do not hold F8_E5M2 \[32\]"):
        dd.load_target(path)
    _set_dtype(p, "model.norm.weight", "F12")
    with pytest.raises(ValueError, match=r"model\.norm\.weight: unknown dtype 'F12'"):
        dd.load_target(path)


def test_missing_shard_and_missing_files(tmp_path):
    dst = tmp_path / "ck"
    shutil.copytree(os.path.join(DATA, "v3_released"), dst)
    os.remove(dst / "model-00002-of-00002.safetensors")
    with pytest.raises(ValueError, match="shard model-00002-of-00002.safetensors"):
        dd.load_target(dst)
    empty = tmp_path / "empty"
    empty.mkdir()
    shutil.copy(os.path.join(SRC, "config.json"), empty)
    with pytest.raises(ValueError, match="no .safetensors"):
        dd.load_target(empty)
    with pytest.raises(ValueError, match="not a directory"):
        dd.load_target(tmp_path / "nowhere")


def test_corrupt_file(tmp_path):
    d = tmp_path / "ck"
    d.mkdir()
    shutil.copy(os.path.join(SRC, "config.json"), d)
    (d / "model.safetensors").write_bytes(b"\xff" * 4)
    with pytest.raises(ValueError, match="not a safetensors file"):
        dd.load_target(d)
    (d / "model.safetensors").write_bytes((5).to_bytes(8, "little") + b"{nope")
    with pytest.raises(ValueError, match="corrupt safetensors header"):
        dd.load_target(d)


# -- what the safetensors library would refuse, and checkpoints that disagree with their config ------

def _edit_header(path, edit):
    header, data = _raw_header(path)
    data = edit(header, data)
    _write_raw(path, header, data)


def _swap_offsets(header, data):
    """Two tensors of one size trade byte ranges: every check the old parser made still passes."""
    a, b = "model.layers.0.input_layernorm.weight", "model.layers.0.post_attention_layernorm.weight"
    header[a]["data_offsets"], header[b]["data_offsets"] = header[b]["data_offsets"], header[a]["data_offsets"]
    return data


@pytest.mark.parametrize("edit, words", [
    (lambda h, d: (h["model.norm.weight"].update(data_offsets=[h["model.norm.weight"]["data_offsets"][0] + 4,
                                                                h["model.norm.weight"]["data_offsets"][1] + 4]), d)[1],
     "overlaps the tensor before it|leaves a gap"),
    (lambda h, d: d + b"\0" * 16, "the tensors end at byte"),                          # trailing bytes
    (lambda h, d: d[:-16], "the file is truncated"),                                     # cut short
    (lambda h, d: (h["model.norm.weight"].update(shape=[16]), d)[1], "bytes do not hold F32 \\[16\\]"),
    (lambda h, d: (h["model.norm.weight"].update(shape=[-32]), d)[1], "not a list of non-negative integers"),
    (lambda h, d: (h["model.norm.weight"].pop("dtype"), d)[1], "needs dtype, shape and data_offsets"),
    (lambda h, d: (h.update(__metadata__={"format": 1}), d)[1], "__metadata__ must map names to strings"),
])
def test_a_header_inconsistent_with_its_data_is_refused_naming_the_file(tmp_path, edit, words):
    """The safetensors library refuses these files; so must the package's own parser (it used to
    load some of them and compute with the wrong bytes)."""
    path = _rewrite(SRC, tmp_path / "ck")
    file = os.path.join(path, "model.safetensors")
    _edit_header(file, edit)
    with pytest.raises(ValueError, match=words) as err:
        dd.load_target(path)
    assert "model.safetensors" in str(err.value)


def test_swapped_ranges_are_consistent_and_load(tmp_path):
    """A header whose ranges are consistent loads: the checks above refuse what is malformed, not
    what is merely unusual (two tensors stored in the other order)."""
    path = _rewrite(SRC, tmp_path / "ck")
    _edit_header(os.path.join(path, "model.safetensors"), _swap_offsets)
    dd.load_target(path)


def test_tensors_the_config_does_not_read_are_refused(tmp_path):
    """Fewer layers in config.json than in the weights: the rest used to be ignored, and the
    model ran as a different, garbage-producing one."""
    path = _rewrite(SRC, tmp_path / "ck", edit_config=lambda c: c.update(num_hidden_layers=2))
    with pytest.raises(ValueError, match=r"holds tensor model\.layers\.2\..* \(and \d+ more\), which the config "
                                         r"does not read.*num_hidden_layers=2"):
        dd.load_target(path)
    stray = _rewrite(SRC, tmp_path / "stray", lambda t: t.update({"model.extra.weight": t["model.norm.weight"]}))
    with pytest.raises(ValueError, match=r"holds tensor model\.extra\.weight, which the config does not read"):
        dd.load_target(stray)


def test_the_mtp_layer_deepseek_ships_is_the_one_exception():
    """v3_released carries a multi-token-prediction layer at index num_hidden_layers, declared by
    num_nextn_predict_layers: it loads (the layer is not run)."""
    cfg = ModelConfig.from_json(os.path.join(DATA, "v3_released"))
    assert cfg.num_nextn_predict_layers == 1
    index = SafetensorsIndex(os.path.join(DATA, "v3_released"))
    assert any(n.startswith(f"model.layers.{cfg.num_hidden_layers}.") for n in index.entries)
    dd.load_target(os.path.join(DATA, "v3_released"))


@pytest.mark.parametrize("name", ["model.layers.1.mlp.gate.e_score_correction_bias", "model.norm.weight",
                                  "model.layers.0.self_attn.kv_b_proj.weight"])
def test_a_non_finite_weight_is_named_at_load(tmp_path, name):
    """A NaN in the router bias changes which experts run, not the logits' finiteness: it used
    to pass silently. Every weight is checked at load, small or large."""
    def poison(t):
        w = t[name].copy()
        w.reshape(-1)[3] = np.nan
        t[name] = w
    path = _rewrite(SRC, tmp_path / "ck", poison)
    with pytest.raises(ValueError, match=rf"tensor {re.escape(name)} holds 1 non-finite values"):
        dd.load_target(path)


@pytest.mark.parametrize("keep_fp8", [False, True])
def test_an_fp8_nan_byte_is_named_at_load_kept_or_dequantized(tmp_path, keep_fp8):
    """e4m3fn has no infinity; 0x7f / 0xff are NaN. A NaN byte in an fp8 matrix is refused with its
    name whether the loader dequantizes it (numpy) or keeps its bytes (the GPU's path)."""
    from ddtree_numba.model.checkpoint import read_checkpoint
    name = "model.layers.1.self_attn.q_b_proj.weight"

    def poison(t):
        w = t[name].copy()
        w.reshape(-1)[5] = 0xFF
        t[name] = w
    path = _rewrite(os.path.join(DATA, "kimi_fp8"), tmp_path / "ck", poison)
    with pytest.raises(ValueError, match=rf"tensor {re.escape(name)} holds 1 non-finite values"):
        read_checkpoint(path, keep_fp8=keep_fp8)


INT4 = os.path.join(DATA, "kimi_int4")
INT4_MODULE = "model.layers.1.mlp.experts.2.down_proj"


def test_int4_golden_is_packed_as_compressed_tensors_packs_it():
    """The golden was packed by the compressed-tensors library (tools/make_goldens.py): our
    unpacking, packed again, gives its words back; kept, the experts are Int4Grouped; dequantized,
    q * scale per group of 32."""
    from ddtree_numba.dtypes import Int4Grouped
    from ddtree_numba.model.checkpoint import read_checkpoint
    index = SafetensorsIndex(INT4)
    words, dtype = index.raw(INT4_MODULE + ".weight_packed")
    assert dtype == "I32" and words.shape == (32, 4)
    cfg, kept, _ = read_checkpoint(INT4, keep_fp8=True)
    w = kept[INT4_MODULE + ".weight"]
    assert isinstance(w, Int4Grouped) and w.shape == (32, 32) and w.group == 32
    np.testing.assert_array_equal(Int4Grouped.pack(w.values()), words)
    q = w.values()
    assert q.min() >= -8 and q.max() <= 7 and len(np.unique(q)) > 8
    raw_scale = index.raw(INT4_MODULE + ".weight_scale")[0]
    np.testing.assert_array_equal(w.scale, raw_scale)          # kept: the bf16 bits as stored, never widened
    scale = bf16_to_float32(raw_scale)                           # [32, 1]
    np.testing.assert_array_equal(w.dequantize(), q.astype(np.float32) * scale)
    _, plain, _ = read_checkpoint(INT4)
    np.testing.assert_array_equal(plain[INT4_MODULE + ".weight"], q.astype(np.float32) * scale)
    assert not isinstance(kept["model.layers.1.mlp.shared_experts.up_proj.weight"], Int4Grouped)   # ignored


def _int4_ck(tmp_path, edit_tensors=None, edit_config=None):
    return _rewrite(INT4, tmp_path / "ck", edit_tensors, edit_config)


def test_int4_missing_scale_is_named(tmp_path):
    path = _int4_ck(tmp_path, lambda t: t.pop(INT4_MODULE + ".weight_scale"))
    with pytest.raises(ValueError, match=rf"missing tensor {re.escape(INT4_MODULE)}\.weight_scale"):
        dd.load_target(path)


def test_int4_wrong_weight_shape_is_named(tmp_path):
    def wrong(t):
        t[INT4_MODULE + ".weight_shape"] = np.array([32, 24], np.int64)
    with pytest.raises(ValueError, match=rf"tensor {re.escape(INT4_MODULE)}\.weight_shape holds \[32, 24\]"):
        dd.load_target(_int4_ck(tmp_path, wrong))


def test_int4_group_that_does_not_divide_the_inputs_is_named(tmp_path):
    def group_24(c):
        c["quantization_config"]["config_groups"]["group_0"]["weights"]["group_size"] = 24
    with pytest.raises(ValueError, match=r"int4 group_size 24 does not divide its 32 inputs"):
        dd.load_target(_int4_ck(tmp_path, edit_config=group_24))


def test_config_json_errors_name_the_file(tmp_path):
    path = _rewrite(SRC, tmp_path / "ck")
    with open(os.path.join(path, "config.json"), "w") as f:
        f.write("{not json")
    with pytest.raises(ValueError, match=r"config\.json is not valid JSON"):
        dd.load_target(path)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump({"model_type": "deepseek_v3"}, f)
    with pytest.raises(ValueError, match=r"config\.json: config has no vocab_size, hidden_size"):
        dd.load_target(path)
