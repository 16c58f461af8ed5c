"""Train the demo pair: a small byte-level DeepSeek-V3-architecture target and its DFlash drafter.

Needs the ``train`` extra (torch, transformers >= 5: ``DeepseekV3ForCausalLM`` with fused experts
and ``rope_parameters``); the package itself never imports torch. Run from the repo root:

    python tools/train_demo.py --device cuda                 # the shipped pair: a 13-minute budget on one H200
    python tools/train_demo.py --smoke --device cpu --out /tmp/demo   # tiny sizes, seconds on a CPU

What it does, in order (every random choice seeded by ``--seed``):

1. Data: the ``.py`` files of the running Python's standard library (``sysconfig`` stdlib path,
   site-packages excluded), read as bytes. Token ids 0-255 are the byte values; 256 BOS, 257 EOS
   (around every file), 258 PAD and 259 MASK (the drafter's mask token) follow; the vocabulary is
   264. Modules whose relative path hashes to 0 mod ``--heldout-mod`` (test files never) are held
   out: the target's held-out loss, the drafter's held-out metrics and the demo prompts come from
   them only.
2. Target: HF ``DeepseekV3ForCausalLM`` (MLA with q_lora, a dense first layer, then MoE layers with
   sigmoid scores, noaux_tc group routing and a shared expert), trained on random windows.
   The routers' ``e_score_correction_bias`` follows DeepSeek-V3's auxiliary-loss-free balancing
   rule (bias += 1e-3 * sign(mean load - load) after every step). The weights are then rounded to
   the export dtype in place, so everything after this sees exactly the target that is shipped.
3. Drafter data: greedy continuations by the (rounded) target of training-text prefixes
   (``prefix`` text bytes, then ``seq_len - prefix`` greedy tokens, float32).
4. Drafter: DFlash (non-causal Qwen3-style layers, block 16, the target's embedding and lm_head,
   frozen), reading the target's hidden states at ``target_layer_ids`` as the reference DFlash
   code does (HF ``hidden_states[i + 1]``: layer i's output, final-normed for the last layer). Each step takes
   sequences of the pool, random anchors ``a`` in their greedy part, the blocks
   ``[x[a], MASK x 15]`` at positions ``a .. a+15``, each block seeing the context rows ``< a`` and
   its own 16 rows (one packed attention mask), and the cross-entropy of the 15 masked positions
   against the target's greedy tokens (argmax of the target's logits at ``a .. a+14``).
5. Export into ``--out`` (default ``ddtree_numba/data/demo/``): ``target/`` and ``drafter/``
   (config.json + model.safetensors each, bf16 by default, routers kept float32), ``demo.json``
   (data provenance, held-out modules, demo prompts, metrics) and ``MODEL_CARD.md``; 30 MB at most.
6. Check (``--no-check`` skips it): ``dd.load_target`` / ``dd.load_drafter`` read the export, the
   numpy forwards agree with torch on it, and ``dd.generate`` ddtree == ar on a held-out prompt.

Step counts: ``--target-steps`` / ``--drafter-steps``, or, when left out, whatever fits the
``--minutes`` budget: the first steps are timed (inside the warmup, whose learning rates do not
depend on the total) and the total is fixed from them. The model card records the counts and the
command that repeats the run with them.

Warm start: ``--stage drafter --init-drafter DIR`` trains an exported drafter further (``DIR``: its
config.json + model.safetensors, e.g. ``ddtree_numba/data/demo/drafter``) instead of a fresh one,
usually with a lower ``--drafter-lr`` and a short ``--drafter-warmup``. Everything else is the
drafter stage as above (same pool, anchors and held-out set for a given seed); the card records
where DIR came from (from the ``demo.json`` beside it), the steps before and in this run, and the
held-out metrics of DIR's weights before this run.
"""

from __future__ import annotations

import argparse
import hashlib
import inspect
import json
import math
import os
import platform
import shutil
import sys
import sysconfig
import tempfile
import time

import numpy as np
import torch
import torch.nn.functional as F
import transformers
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_OUT = os.path.join(ROOT, "ddtree_numba", "data", "demo")

BOS, EOS, PAD, MASK = 256, 257, 258, 259
SPECIALS = {"bos": BOS, "eos": EOS, "pad": PAD, "mask": MASK}
VOCAB = 264
BLOCK = 16
SIZE_LIMIT = 30_000_000          # bytes, both checkpoints together
BIAS_UPDATE = 1e-3               # DeepSeek-V3's bias update speed
EXPORT_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}

PRESETS = {
    "full": dict(
        target=dict(hidden_size=256, num_hidden_layers=6, num_attention_heads=8, q_lora_rank=128,
                    kv_lora_rank=64, qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32,
                    intermediate_size=768, moe_intermediate_size=128, n_routed_experts=16,
                    n_shared_experts=1, num_experts_per_tok=4, n_group=4, topk_group=2,
                    first_k_dense_replace=1, routed_scaling_factor=2.5, max_position_embeddings=1024),
        drafter=dict(num_hidden_layers=3, num_attention_heads=8, num_key_value_heads=4, head_dim=32,
                     intermediate_size=768),
        seq_len=512, batch=64, lr=2e-3, warmup=300,
        prefix=128, pool=16384, gen_batch=2048, eval_pool=256,
        d_batch=32, anchors=32, d_lr=1e-3, d_warmup=200,
        eval_windows=128, prompts=8, prompt_bytes=192, log_every=100),
    "smoke": dict(
        target=dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, q_lora_rank=16,
                    kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=8,
                    intermediate_size=64, moe_intermediate_size=16, n_routed_experts=4,
                    n_shared_experts=1, num_experts_per_tok=2, n_group=2, topk_group=1,
                    first_k_dense_replace=1, routed_scaling_factor=2.5, max_position_embeddings=256),
        drafter=dict(num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                     intermediate_size=64),
        seq_len=64, batch=4, lr=3e-3, warmup=4, target_steps=6,
        prefix=16, pool=8, gen_batch=8, eval_pool=4,
        d_batch=4, anchors=4, d_lr=3e-3, d_warmup=4, drafter_steps=6,
        eval_windows=4, prompts=3, prompt_bytes=48, log_every=2),
}


def log(msg):
    print(f"[train_demo {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ----------------------------------------------------------------------------------------------
# data
# ----------------------------------------------------------------------------------------------
def _is_test(rel):
    parts = rel.split("/")
    return any(p in ("test", "tests", "idle_test") for p in parts[:-1]) or parts[-1].startswith("test_")


def collect_corpus(heldout_mod, include_tests):
    """The stdlib's .py files as one token stream each for train and held-out, plus provenance."""
    root = sysconfig.get_paths()["stdlib"]
    rels = []
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root)
        dirnames[:] = sorted(d for d in dirnames if d not in ("site-packages", "dist-packages", "__pycache__"))
        for f in filenames:
            if f.endswith(".py"):
                rels.append(os.path.normpath(os.path.join(rel_dir, f)).replace(os.sep, "/"))
    rels.sort()
    train, held, held_names, digest = [], [], [], hashlib.sha256()
    n_train = 0
    for rel in rels:
        test = _is_test(rel)
        if test and not include_tests:
            continue
        with open(os.path.join(root, rel), "rb") as f:
            data = f.read()
        digest.update(rel.encode() + b"\0" + data + b"\0")
        ids = np.concatenate([[BOS], np.frombuffer(data, np.uint8).astype(np.uint16), [EOS]]).astype(np.uint16)
        if not test and int(hashlib.sha1(rel.encode()).hexdigest(), 16) % heldout_mod == 0:
            held.append(ids)
            held_names.append(rel)
        else:
            train.append(ids)
            n_train += 1
    if not train or not held:
        raise SystemExit(f"no usable .py files under {root} (train {len(train)}, held out {len(held)})")
    info = dict(python_version=platform.python_version(), python_implementation=platform.python_implementation(),
                stdlib_path=root, include_tests=include_tests, heldout_rule=f"sha1(relative path) % {heldout_mod} == 0, test files never",
                train_files=n_train, heldout_files=len(held_names), heldout_modules=held_names,
                train_bytes=int(sum(len(x) - 2 for x in train)), heldout_bytes=int(sum(len(x) - 2 for x in held)),
                corpus_sha256=digest.hexdigest())
    return np.concatenate(train), np.concatenate(held), held, held_names, info


def windows(stream, starts, length):
    """[len(starts), length] int64 token windows."""
    return torch.from_numpy(stream[starts[:, None] + np.arange(length)].astype(np.int64))


def random_windows(stream, rng, n, length):
    return windows(stream, rng.integers(0, len(stream) - length, n), length)


def demo_prompts(held_files, held_names, rng, n, nbytes):
    """``n`` prompts from distinct held-out modules: ``nbytes`` bytes ending at a line end,
    starting at a line start past the first third of the file (licence headers skipped)."""
    out = []
    order = rng.permutation(len(held_files))
    for i in order:
        if held_names[i].startswith("encodings/"):          # codec tables: not much code to continue
            continue
        data = bytes(held_files[i][1:-1].astype(np.uint8))
        lo = len(data) // 3
        start = data.find(b"\n", lo) + 1
        if start <= 0 or len(data) - start < 2 * nbytes:
            continue
        end = data.rfind(b"\n", start, start + nbytes) + 1
        if end - start < nbytes // 2:
            continue
        text = data[start:end]
        out.append(dict(module=held_names[i], byte_offset=start, ids=list(text),
                        text=text.decode("utf-8", errors="replace")))
        if len(out) == n:
            break
    return out


# ----------------------------------------------------------------------------------------------
# target
# ----------------------------------------------------------------------------------------------
def _cache_kw():
    params = inspect.signature(DeepseekV3ForCausalLM.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


CACHE_KW = _cache_kw()


def build_target(tc):
    heads = tc["num_attention_heads"]
    cfg = DeepseekV3Config(
        vocab_size=VOCAB, num_key_value_heads=heads, norm_topk_prob=True, hidden_act="silu",
        rms_norm_eps=1e-6, tie_word_embeddings=False, rope_interleave=True,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        bos_token_id=BOS, eos_token_id=EOS, pad_token_id=PAD, **tc)
    model = DeepseekV3ForCausalLM(cfg)
    for gate in routers(model):
        gate.e_score_correction_bias.zero_()
    return model


def set_experts_impl(model, requested, device):
    """``requested``, or HF's default (grouped_mm where torch has it) if a probe forward and
    backward (bf16 autocast, then float32, as training and the greedy data run) works on this
    device, else eager (torch's grouped_mm kernels are bf16-only on some CUDA builds)."""
    if requested:
        model.set_experts_implementation(requested)
        return requested
    x = torch.randint(0, 256, (2, 8), device=device)
    try:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            model(input_ids=x, use_cache=False).logits.float().sum().backward()
        with torch.no_grad():
            model(input_ids=x, use_cache=False)
        model.zero_grad(set_to_none=True)
    except Exception as e:                                   # noqa: BLE001 (any failure: use eager)
        log(f"experts implementation {model.config._experts_implementation} failed a probe ({type(e).__name__}: "
            f"{str(e)[:200]}); using eager")
        model.zero_grad(set_to_none=True)
        model.set_experts_implementation("eager")
    return model.config._experts_implementation


def routers(model):
    return [m.mlp.gate for m in model.model.layers if hasattr(m.mlp, "gate") and hasattr(m.mlp.gate, "e_score_correction_bias")]


class LoadBalancer:
    """DeepSeek-V3's auxiliary-loss-free balancing: count each router's picks during a step,
    then move its correction bias by ``speed * sign(mean load - load)``."""

    def __init__(self, model, speed):
        self.gates, self.speed = routers(model), speed
        self.counts = [torch.zeros(g.e_score_correction_bias.shape[0], device=g.weight.device) for g in self.gates]
        self.hooks = [g.register_forward_hook(self._hook(i)) for i, g in enumerate(self.gates)]

    def _hook(self, i):
        def hook(module, args, out):
            with torch.no_grad():
                idx = out[2].reshape(-1)
                self.counts[i] += torch.bincount(idx, minlength=self.counts[i].shape[0]).float()
        return hook

    @torch.no_grad()
    def update(self):
        for g, c in zip(self.gates, self.counts):
            g.e_score_correction_bias += self.speed * torch.sign(c.mean() - c)
            c.zero_()

    def imbalance(self):
        """max load / mean load per router (over the counts since the last update)."""
        return [float(c.max() / c.mean().clamp(min=1)) for c in self.counts]

    def remove(self):
        for h in self.hooks:
            h.remove()


def keep_f32(name):
    """Routers stay float32 on disk (as released DeepSeek-V3 checkpoints keep them)."""
    return name.endswith("mlp.gate.weight") or name.endswith("e_score_correction_bias")


@torch.no_grad()
def round_weights(model, dtype, skip=keep_f32):
    for name, p in model.named_parameters():
        if not skip(name):
            p.copy_(p.to(dtype).float())


def lr_at(step, base, warmup, total):
    if step < warmup:
        return base * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return base * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def make_optimizer(model, lr):
    decay = [p for p in model.parameters() if p.requires_grad and p.ndim >= 2]
    other = [p for p in model.parameters() if p.requires_grad and p.ndim < 2]
    fused = next(model.parameters()).is_cuda
    return torch.optim.AdamW([dict(params=decay, weight_decay=0.1), dict(params=other, weight_decay=0.0)],
                             lr=lr, betas=(0.9, 0.95), eps=1e-8, fused=fused)


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def train_loop(name, step_fn, steps, budget_s, warmup, device, log_every):
    """Run ``step_fn(step, total) -> loss tensor`` for ``steps`` steps or, with steps None, for as
    many as ``budget_s`` allows: steps 3..calib are timed (calib <= warmup, so the learning rates
    of the timed steps do not depend on the total) and the total fixed from them."""
    t0 = time.perf_counter()
    calib = max(4, min(warmup, 30))
    total = steps if steps is not None else None
    losses, recent, step = [], [], 0
    t_mark = None
    while total is None or step < total:
        loss = step_fn(step, total if total is not None else 10 ** 9)
        recent = (recent + [loss])[-50:]                    # device tensors: no sync per step
        if step % log_every == 0:
            losses.append((step, round(float(loss), 4)))
        if total is None and step == 2:
            sync(device)
            t_mark = time.perf_counter()
        if total is None and step == calib - 1:
            sync(device)
            per = (time.perf_counter() - t_mark) / (calib - 3)
            left = budget_s - (time.perf_counter() - t0)
            total = max(calib, calib + int(left / per))
            log(f"{name}: {per * 1e3:.1f} ms/step, {total} steps fit the {budget_s:.0f} s budget")
        if step % log_every == 0:
            log(f"{name} step {step}/{total or '?'} loss {float(loss):.4f} ({time.perf_counter() - t0:.0f} s)")
        step += 1
    sync(device)
    final = float(torch.stack(recent).float().mean())
    losses.append((total - 1, round(float(recent[-1]), 4)))
    return dict(steps=total, seconds=round(time.perf_counter() - t0, 1), final_loss=final,
                final_loss_steps=len(recent), loss_curve=losses)


def train_target(model, train, rng, p, args, device, budget_s):
    model.train()
    opt = make_optimizer(model, p["lr"])
    balancer = LoadBalancer(model, BIAS_UPDATE)
    amp = device.type == "cuda"
    seq = p["seq_len"]

    def step_fn(step, total):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, p["lr"], p["warmup"], total)
        x = random_windows(train, rng, p["batch"], seq + 1).to(device, non_blocking=True)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
            logits = model(input_ids=x[:, :-1], use_cache=False).logits
        loss = F.cross_entropy(logits.float().reshape(-1, VOCAB), x[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        balancer.update()
        return loss.detach()

    stats = train_loop("target", step_fn, args.target_steps, budget_s, p["warmup"], device, p["log_every"])
    with torch.no_grad():                                   # the routers' loads, for the record
        model(input_ids=random_windows(train, rng, 4, seq).to(device), use_cache=False)
    stats["router_max_over_mean_load"] = [round(v, 2) for v in balancer.imbalance()]
    stats["router_bias_abs_max"] = [round(float(g.e_score_correction_bias.abs().max()), 4) for g in balancer.gates]
    balancer.remove()
    model.eval()
    return stats


@torch.no_grad()
def eval_target(model, held, p, seed, device):
    """Mean cross-entropy (nats per token) over fixed held-out windows, float32."""
    rng = np.random.default_rng([seed, 7])
    seq, total, n = p["seq_len"], 0.0, 0
    x_all = random_windows(held, rng, p["eval_windows"], seq + 1)
    for i in range(0, len(x_all), 16):
        x = x_all[i:i + 16].to(device)
        logits = model(input_ids=x[:, :-1], use_cache=False).logits.float()
        total += float(F.cross_entropy(logits.reshape(-1, VOCAB), x[:, 1:].reshape(-1), reduction="sum"))
        n += x[:, 1:].numel()
    return total / n


@torch.no_grad()
def greedy(model, prompts, n_new):
    """Greedy continuation with HF's cache: [b, P] -> [b, P + n_new], float32."""
    b, p = prompts.shape
    out = model(input_ids=prompts, position_ids=torch.arange(p, device=prompts.device)[None].expand(b, p),
                use_cache=True, logits_to_keep=1)
    cache = out.cache if hasattr(out, "cache") and out.cache is not None else out.past_key_values
    tok = out.logits[:, -1].argmax(-1)
    toks = [tok]
    for i in range(n_new - 1):
        pos = torch.full((b, 1), p + i, device=prompts.device, dtype=torch.long)
        out = model(input_ids=tok[:, None], position_ids=pos, use_cache=True, logits_to_keep=1, **{CACHE_KW: cache})
        cache = out.cache if hasattr(out, "cache") and out.cache is not None else out.past_key_values
        tok = out.logits[:, -1].argmax(-1)
        toks.append(tok)
    return torch.cat([prompts, torch.stack(toks, 1)], 1)


def greedy_pool(model, stream, rng, n, p, device):
    seqs = []
    for i in range(0, n, p["gen_batch"]):
        prompts = random_windows(stream, rng, min(p["gen_batch"], n - i), p["prefix"]).to(device)
        seqs.append(greedy(model, prompts, p["seq_len"] - p["prefix"]).cpu())
    return torch.cat(seqs)


def target_features(model, seqs, layer_ids):
    """The drafter's context features [b, T, Y*M] and the target's greedy next token at every
    position [b, T], float32 (the package's numpy forward's precision). The feature of layer i is
    HF's ``hidden_states[i + 1]``, as the reference DFlash code takes it: the output of decoder
    layer i, and for the last layer the final-normed state (HF's last entry)."""
    out = model(input_ids=seqs, use_cache=False, output_hidden_states=True)
    return torch.cat([out.hidden_states[i + 1].float() for i in layer_ids], -1), out.logits.argmax(-1)


# ----------------------------------------------------------------------------------------------
# DFlash drafter
# ----------------------------------------------------------------------------------------------
class RMSNorm(nn.Module):
    def __init__(self, n, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x):                                  # float32 out
        x = x.float()
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


def rotate(x, cos, sin):
    """Rotate-half (NeoX) rope, as Qwen3 and the package's drafter (interleave=False)."""
    h = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., h:], x[..., :h]], -1) * sin


class DraftAttention(nn.Module):
    def __init__(self, m, hq, hkv, dh, eps):
        super().__init__()
        self.hq, self.hkv, self.dh = hq, hkv, dh
        self.q_proj = nn.Linear(m, hq * dh, bias=False)
        self.k_proj = nn.Linear(m, hkv * dh, bias=False)
        self.v_proj = nn.Linear(m, hkv * dh, bias=False)
        self.o_proj = nn.Linear(hq * dh, m, bias=False)
        self.q_norm = RMSNorm(dh, eps)
        self.k_norm = RMSNorm(dh, eps)

    def forward(self, h, ctx, rope_q, rope_k, mask):
        b, q, _ = h.shape
        n = ctx.shape[1]
        both = torch.cat([ctx, h], 1)                                          # [b, n + q, M]
        v = self.v_proj(both).view(b, n + q, self.hkv, self.dh).transpose(1, 2)
        qh = rotate(self.q_norm(self.q_proj(h).view(b, q, self.hq, self.dh)).transpose(1, 2), *rope_q)
        kh = rotate(self.k_norm(self.k_proj(both).view(b, n + q, self.hkv, self.dh)).transpose(1, 2), *rope_k)
        g = self.hq // self.hkv
        kh, v2 = kh.to(v.dtype).repeat_interleave(g, 1), v.repeat_interleave(g, 1)
        o = F.scaled_dot_product_attention(qh.to(v.dtype), kh, v2, attn_mask=mask, scale=self.dh ** -0.5)
        return self.o_proj(o.transpose(1, 2).reshape(b, q, self.hq * self.dh))


class DraftMLP(nn.Module):
    def __init__(self, m, inter):
        super().__init__()
        self.gate_proj = nn.Linear(m, inter, bias=False)
        self.up_proj = nn.Linear(m, inter, bias=False)
        self.down_proj = nn.Linear(inter, m, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DraftLayer(nn.Module):
    def __init__(self, m, hq, hkv, dh, inter, eps):
        super().__init__()
        self.self_attn = DraftAttention(m, hq, hkv, dh, eps)
        self.mlp = DraftMLP(m, inter)
        self.input_layernorm = RMSNorm(m, eps)
        self.post_attention_layernorm = RMSNorm(m, eps)

    def forward(self, x, ctx, rope_q, rope_k, mask):
        x = x + self.self_attn(self.input_layernorm(x), ctx, rope_q, rope_k, mask).float()
        return x + self.mlp(self.post_attention_layernorm(x)).float()


class DFlashDrafter(nn.Module):
    """Parameter names are the checkpoint's (``layers.{i}.self_attn.q_proj.weight``, ``fc.weight``, ...)."""

    def __init__(self, m, n_feature_layers, num_hidden_layers, num_attention_heads, num_key_value_heads,
                 head_dim, intermediate_size, eps=1e-6, rope_theta=10000.0):
        super().__init__()
        self.layers = nn.ModuleList(DraftLayer(m, num_attention_heads, num_key_value_heads, head_dim,
                                               intermediate_size, eps) for _ in range(num_hidden_layers))
        self.fc = nn.Linear(n_feature_layers * m, m, bias=False)
        self.hidden_norm = RMSNorm(m, eps)
        self.norm = RMSNorm(m, eps)
        inv = 1.0 / rope_theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
        self.register_buffer("inv_freq", inv, persistent=False)

    def _rope(self, pos):                                  # pos [b, t] -> cos, sin [b, 1, t, Dh]
        ang = pos[..., None].double() * self.inv_freq
        ang = torch.cat([ang, ang], -1).float()[:, None]
        return ang.cos(), ang.sin()

    def forward(self, feats, block_emb, ctx_pos, block_pos, mask):
        """feats [b, n, Y*M], block_emb [b, q, M], ctx_pos [b, n], block_pos [b, q],
        mask [b, 1, q, n + q] bool (True: may attend) -> final-normed hidden [b, q, M] float32."""
        ctx = self.hidden_norm(self.fc(feats))
        rope_q = self._rope(block_pos)
        rope_k = self._rope(torch.cat([ctx_pos, block_pos], 1))
        x = block_emb.float()
        for layer in self.layers:
            x = layer(x, ctx, rope_q, rope_k, mask)
        return self.norm(x)


def drafter_batch(seqs, greedy_next, feats, anchors, target, drafter, device):
    """Blocks at ``anchors`` [b, J] (positions whose token starts a block) -> (logits [b, J, 15, V],
    labels [b, J, 15])."""
    b, t = seqs.shape
    j = anchors.shape[1]
    offs = torch.arange(BLOCK, device=device)
    block_ids = torch.full((b, j, BLOCK), MASK, dtype=torch.long, device=device)
    block_ids[:, :, 0] = seqs.gather(1, anchors)
    labels = greedy_next.gather(1, (anchors[:, :, None] + offs[:-1]).reshape(b, -1)).view(b, j, BLOCK - 1)
    block_pos = (anchors[:, :, None] + offs).reshape(b, j * BLOCK)
    ctx_mask = torch.arange(t, device=device)[None, None, None, :] < anchors[:, :, None, None]   # [b, J, 1, T]
    ctx_mask = ctx_mask.expand(b, j, BLOCK, t).reshape(b, j * BLOCK, t)
    blk = torch.arange(j * BLOCK, device=device) // BLOCK
    self_mask = (blk[:, None] == blk[None, :]).expand(b, -1, -1)
    mask = torch.cat([ctx_mask, self_mask], -1)[:, None]                                  # [b, 1, Q, T + Q]
    emb = target.model.embed_tokens(block_ids.view(b, -1))
    ctx_pos = torch.arange(t, device=device)[None].expand(b, t)
    h = drafter(feats, emb, ctx_pos, block_pos, mask).view(b, j, BLOCK, -1)[:, :, 1:]
    logits = target.lm_head(h.to(target.lm_head.weight.dtype))
    return logits, labels


def sample_anchors(rng, b, j, lo, hi, device):
    """[b, j] distinct anchors in [lo, hi) per row, sorted."""
    a = np.stack([np.sort(rng.choice(hi - lo, size=j, replace=False)) + lo for _ in range(b)])
    return torch.from_numpy(a).to(device)


def train_drafter(drafter, target, pool, layer_ids, rng, p, args, device, budget_s):
    drafter.train()
    opt = make_optimizer(drafter, p["d_lr"])
    amp = device.type == "cuda"
    t = p["seq_len"]
    lo, hi = p["prefix"], t - BLOCK + 1

    def step_fn(step, total):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, p["d_lr"], p["d_warmup"], total)
        seqs = pool[torch.from_numpy(rng.integers(0, len(pool), p["d_batch"]))].to(device)
        with torch.no_grad():
            feats, nxt = target_features(target, seqs, layer_ids)
        anchors = sample_anchors(rng, p["d_batch"], p["anchors"], lo, hi, device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
            logits, labels = drafter_batch(seqs, nxt, feats, anchors, target, drafter, device)
        loss = F.cross_entropy(logits.float().reshape(-1, VOCAB), labels.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(drafter.parameters(), 1.0)
        opt.step()
        return loss.detach()

    stats = train_loop("drafter", step_fn, args.drafter_steps, budget_s, p["d_warmup"], device, p["log_every"])
    drafter.eval()
    return stats


@torch.no_grad()
def eval_drafter(drafter, target, pool, layer_ids, p, seed, device):
    """On held-out greedy continuations, fixed anchors, float32: loss, per-depth top-1 accuracy
    and the DFlash chain's acceptance length at each anchor (1 + leading correct drafts: what a
    chain of the drafter's argmax tokens would commit per target forward), averaged."""
    rng = np.random.default_rng([seed, 11])
    t = p["seq_len"]
    total, n, correct, accept = 0.0, 0, torch.zeros(BLOCK - 1), []
    for i in range(0, len(pool), 16):
        seqs = pool[i:i + 16].to(device)
        feats, nxt = target_features(target, seqs, layer_ids)
        anchors = sample_anchors(rng, seqs.shape[0], p["anchors"], p["prefix"], t - BLOCK + 1, device)
        logits, labels = drafter_batch(seqs, nxt, feats, anchors, target, drafter, device)
        total += float(F.cross_entropy(logits.reshape(-1, VOCAB), labels.reshape(-1), reduction="sum"))
        n += labels.numel()
        ok = (logits.argmax(-1) == labels)                          # [b, J, 15]
        correct += ok.float().sum((0, 1)).cpu()
        accept.append(1 + ok.int().cumprod(-1).sum(-1).flatten().cpu())
    anchors_seen = n // (BLOCK - 1)
    acc = torch.cat(accept).float()
    return dict(loss=total / n, top1_by_depth=[round(float(c) / anchors_seen, 4) for c in correct],
                chain_acceptance=round(float(acc.mean()), 3), anchors=anchors_seen)


# ----------------------------------------------------------------------------------------------
# export and check
# ----------------------------------------------------------------------------------------------
def export_target(model, directory, dtype):
    os.makedirs(directory, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        state = {}
        for f in sorted(os.listdir(tmp)):
            if f.endswith(".safetensors"):
                state.update(load_file(os.path.join(tmp, f)))
        with open(os.path.join(tmp, "config.json")) as f:
            config = json.load(f)
    tensors = {n: (w.float() if keep_f32(n) else w.to(dtype)).contiguous() for n, w in state.items()}
    save_file(tensors, os.path.join(directory, "model.safetensors"), metadata={"format": "pt"})
    config["dtype"] = str(dtype).replace("torch.", "")
    config.pop("_experts_implementation", None)
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)


def drafter_config_dict(m, dc, layer_ids, n_target_layers):
    sys.path.insert(0, ROOT)
    from ddtree_numba.model.drafter import DrafterConfig   # numpy only: the format's single source
    cfg = DrafterConfig(hidden_size=m, num_hidden_layers=dc["num_hidden_layers"],
                        num_attention_heads=dc["num_attention_heads"],
                        num_key_value_heads=dc["num_key_value_heads"], head_dim=dc["head_dim"],
                        intermediate_size=dc["intermediate_size"], rms_norm_eps=1e-6, rope_theta=10000.0,
                        block_size=BLOCK, target_layer_ids=tuple(layer_ids), mask_token_id=MASK)
    cfg.validate()
    d = cfg.to_dict()
    d.update(num_target_layers=n_target_layers, vocab_size=VOCAB, max_position_embeddings=2048)
    return d


def _flat_config(d):
    """A drafter config.json as one level of keys (``dflash_config.target_layer_ids``, ...)."""
    inner = d.get("dflash_config")
    inner = inner if isinstance(inner, dict) else {"": inner}
    return {**{k: v for k, v in d.items() if k != "dflash_config"},
            **{f"dflash_config.{k}".rstrip("."): v for k, v in inner.items()}}


def read_init_drafter(directory, config, shapes):
    """``--init-drafter DIR``'s weights as float32 tensors by name. DIR's config.json must be the one
    this run would write (every field of ``drafter_config_dict``: the sizes, layers, heads, target
    layers, block and vocabulary fix the tensors' shapes, the rest what they mean; ``dtype`` aside),
    and its tensors exactly the module's, each of its shape. The export holds the drafter's own
    parameters only (``DFlashDrafter.state_dict()``): its embedding and lm_head are the target's,
    frozen, taken from the target as in a fresh run and never written, so a file that holds an
    embedding or head of its own is refused (it would not be the drafter this script trains)."""
    with open(os.path.join(directory, "config.json")) as f:
        have = _flat_config(json.load(f))
    want = _flat_config(json.loads(json.dumps(config)))          # tuples as lists, as in the file
    for key, value in want.items():
        if have.get(key, "missing") != value:
            raise ValueError(f"{directory}/config.json has {key} = {have.get(key, 'missing')!r}, this run builds "
                             f"{value!r}; give the flags DIR was trained with (--smoke, --drafter-layers)")
    state = load_file(os.path.join(directory, "model.safetensors"))
    missing, extra = sorted(set(shapes) - set(state)), sorted(set(state) - set(shapes))
    if missing or extra:
        raise ValueError(f"{directory}/model.safetensors is not this drafter's: "
                         + "; ".join(f"{what} {names[:4]}{' ...' if len(names) > 4 else ''}"
                                     for what, names in (("missing", missing), ("unexpected", extra)) if names)
                         + ("; it uses the target's embedding and lm_head and stores none"
                            if any("embed" in n or "lm_head" in n for n in extra) else ""))
    for name, shape in shapes.items():
        if tuple(state[name].shape) != shape:
            raise ValueError(f"{directory}/model.safetensors: {name} has shape {tuple(state[name].shape)}, "
                             f"this run builds {shape}")
    return {name: t.float() for name, t in state.items()}     # bf16 (or fp16) on disk: exact in float32


def init_provenance(directory, config):
    """Where ``--init-drafter DIR`` comes from: the run that exported it, read from the ``demo.json``
    beside DIR (the pair's card) when that card describes these weights (this config, DIR's size
    on disk); else the path alone. Read before anything is written: DIR may be ``--out``'s drafter."""
    info = dict(path=directory, card=None)
    src = os.path.dirname(os.path.abspath(directory))
    try:
        with open(os.path.join(src, "demo.json")) as f:
            meta = json.load(f)
        dr = meta["training"]["drafter"]
        if (_flat_config(meta["drafter"]["config"]) != _flat_config(json.loads(json.dumps(config)))
                or meta["bytes"]["drafter"] != dir_bytes(directory)):
            raise ValueError("the card beside DIR describes other weights")
        info.update(card=os.path.join(src, "demo.json"), command=meta["command"],
                    repeat_command=meta["repeat_command"], total_seconds=meta.get("total_seconds"),
                    steps=dr["steps"], total_steps=dr.get("total_steps", dr["steps"]), seconds=dr["seconds"],
                    lr=meta["preset"]["d_lr"], final_loss=dr["final_loss"],
                    heldout=meta["eval"]["drafter"], target_heldout_loss=meta["eval"]["target_heldout_loss"],
                    target_steps=meta["training"]["target"]["steps"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        log(f"--init-drafter: no card for {directory} ({type(e).__name__}: {e}); recording the path alone")
    return info


def same_target(init, t_rec):
    """Was ``init``'s drafter trained against this run's target? Its card's target must have this
    one's step count and held-out loss (a float to the last bit: a fingerprint of the run). None: no
    card to tell."""
    if not init["card"]:
        return None
    return init["target_heldout_loss"] == t_rec["heldout_loss"] and init["target_steps"] == t_rec["training"]["steps"]


def export_drafter(drafter, directory, dtype, config):
    os.makedirs(directory, exist_ok=True)
    tensors = {n: w.detach().to(dtype).contiguous().cpu() for n, w in drafter.state_dict().items()}
    save_file(tensors, os.path.join(directory, "model.safetensors"), metadata={"format": "pt"})
    config = dict(config, dtype=str(dtype).replace("torch.", ""))
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(config, f, indent=2)


def check_export(out, drafter_cpu, layer_ids, prompt_ids, quick_tokens, budget):
    """The package reads the export; its numpy forwards agree with torch on it; ddtree == ar."""
    sys.path.insert(0, ROOT)
    import ddtree_numba as dd
    res = {}
    t = dd.load_target(os.path.join(out, "target"))
    d = dd.load_drafter(os.path.join(out, "drafter"), t)
    ids = np.asarray(prompt_ids[:24], np.int64)
    n = len(ids)
    got = t.forward(ids, np.arange(n), t.new_cache(n), hidden_layer_ids=layer_ids)
    hf = DeepseekV3ForCausalLM.from_pretrained(os.path.join(out, "target"), dtype=torch.float32).eval()
    with torch.no_grad():
        ref = hf(input_ids=torch.tensor(ids)[None], use_cache=False).logits[0].numpy()
    res["target_logits_rel_err"] = float(np.abs(got.logits - ref).max() / np.abs(ref).max())
    # the drafter: numpy twin vs the torch module holding the exported (rounded) weights
    ctx = n - 1
    block = np.full(BLOCK, MASK, np.int64)
    block[0] = ids[ctx]
    h_np = d.forward(got.hidden[:ctx], block, d.new_cache(n + BLOCK))
    sd = load_file(os.path.join(out, "drafter", "model.safetensors"))
    drafter_cpu.load_state_dict({k: v.float() for k, v in sd.items()})
    with torch.no_grad():
        feats = torch.tensor(got.hidden[:ctx]).reshape(1, ctx, -1)
        emb = torch.tensor(t.embed_tokens[block])[None]
        mask = torch.ones(1, 1, BLOCK, ctx + BLOCK, dtype=torch.bool)
        h_t = drafter_cpu(feats, emb, torch.arange(ctx)[None], torch.arange(ctx, ctx + BLOCK)[None], mask)[0].numpy()
    res["drafter_hidden_rel_err"] = float(np.abs(h_np - h_t).max() / np.abs(h_t).max())
    prompt = np.asarray(prompt_ids, np.int32)
    ar = dd.generate(t, None, prompt, quick_tokens, method="ar")
    tree = dd.generate(t, d, prompt, quick_tokens, method="ddtree", budget=budget)
    chain = dd.generate(t, d, prompt, quick_tokens, method="dflash")
    res["ddtree_equals_ar"] = bool(np.array_equal(tree.tokens, ar.tokens))
    res["dflash_equals_ar"] = bool(np.array_equal(chain.tokens, ar.tokens))
    res["quick_acceptance"] = dict(tokens=quick_tokens, budget=budget,
                                   ddtree=round(float(np.mean(tree.acceptance_lengths)), 3),
                                   dflash=round(float(np.mean(chain.acceptance_lengths)), 3))
    res["passed"] = bool(res["ddtree_equals_ar"] and res["dflash_equals_ar"]
                         and res["target_logits_rel_err"] <= 1e-3 and res["drafter_hidden_rel_err"] <= 1e-3)
    return res


def dir_bytes(path):
    return sum(os.path.getsize(os.path.join(dp, f)) for dp, _, fs in os.walk(path) for f in fs)


def count_params(module):
    return sum(p.numel() for p in module.parameters())


def _code_spans(commands):
    """'cmd1, then cmd2' (a two-stage run) as two code spans, each one pasteable."""
    return ", then ".join(f"`{c}`" for c in commands.split(", then "))


def _warm_start_line(dr):
    """The card's account of ``--init-drafter`` (empty for a drafter trained from scratch)."""
    ws = dr.get("warm_start")
    if not ws:
        return ""
    if not ws["card"]:
        src = "no card beside them, so how they were trained is not recorded"
    else:
        if ws["same_target"]:
            by = "by the runs before this one in the command above"
        else:
            by = (f"by {_code_spans(ws['command'])}, against "
                  + ("another target" if ws["same_target"] is False else "a target not compared with this one"))
        lr = (f"lr {ws['lr']}" if ws["total_steps"] == ws["steps"] else f"the last {ws['steps']} at lr {ws['lr']}")
        src = (f"{ws['total_steps']} steps {by} ({lr}; final training loss {ws['final_loss']:.4f}, "
               f"held-out loss {ws['heldout']['loss']:.4f}, chain acceptance {ws['heldout']['chain_acceptance']})")
    b = ws["heldout_before"]
    return (f" Warm-started from the weights in `{ws['path']}`: {src}; this run: {dr['steps']} more steps in "
            f"{dr['seconds']:.0f} s" + (f", {dr['total_steps']} in all" if dr.get("total_steps") else "")
            + f". Those weights on this run's held-out set, before it: loss {b['loss']:.4f}, "
            f"chain acceptance {b['chain_acceptance']}.")


def model_card(meta):
    tm, dm = meta["target"], meta["drafter"]
    data = meta["data"]
    tr, dr = meta["training"]["target"], meta["training"]["drafter"]
    ev = meta["eval"]
    tc, dc = tm["config"], dm["config"]
    held = data["heldout_modules"]
    lines = [
        "# The demo pair: a byte-level DeepSeek-V3-architecture target and its DFlash drafter",
        "",
        f"Made by {_code_spans(meta['command'])} ({meta['date']}, {meta['device']}, torch {meta['torch']}, "
        f"transformers {meta['transformers']}, seed {meta['seed']}, {meta['total_seconds']:.0f} s in all). "
        f"Repeat it with {_code_spans(meta['repeat_command'])}.",
        "",
        "## Data",
        "",
        f"The `.py` files of the Python {data['python_version']} standard library ({data['python_implementation']}, "
        f"`{data['stdlib_path']}`, site-packages excluded, test files {'included' if data['include_tests'] else 'excluded'}), "
        "read as bytes: token ids 0-255 are the byte values, then "
        + ", ".join(f"{k.upper()} {v}" for k, v in SPECIALS.items())
        + f"; vocabulary {VOCAB}. Every file is wrapped in BOS ... EOS.",
        f"Training: {data['train_files']} files, {data['train_bytes'] / 1e6:.1f} MB. "
        f"Held out ({data['heldout_rule']}): {data['heldout_files']} modules, {data['heldout_bytes'] / 1e6:.2f} MB: "
        + ", ".join(f"`{h}`" for h in held[:40]) + (" ..." if len(held) > 40 else "")
        + f" (all of them in `demo.json`). Corpus sha256 `{data['corpus_sha256'][:16]}...`.",
        "",
        "## Target",
        "",
        f"HF `DeepseekV3ForCausalLM`, {tm['params'] / 1e6:.2f} M parameters: hidden {tc['hidden_size']}, "
        f"{tc['num_hidden_layers']} layers (layer 0 dense, intermediate {tc['intermediate_size']}; then MoE: "
        f"{tc['n_routed_experts']} routed experts of {tc['moe_intermediate_size']}, {tc['num_experts_per_tok']} per token, "
        f"{tc['n_shared_experts']} shared, sigmoid scores, noaux_tc over {tc['n_group']} groups keeping {tc['topk_group']}, "
        f"routed scaling {tc['routed_scaling_factor']}), MLA with {tc['num_attention_heads']} heads, q_lora {tc['q_lora_rank']}, "
        f"kv_lora {tc['kv_lora_rank']}, qk {tc['qk_nope_head_dim']} + rope {tc['qk_rope_head_dim']}, v {tc['v_head_dim']}; "
        f"interleaved rope, theta 10000. Stored {meta['export_dtype']} (routers float32).",
        f"Training: {tr['steps']} steps of {meta['preset']['batch']} windows x {meta['preset']['seq_len']} bytes "
        f"(AdamW, lr {meta['preset']['lr']}, warmup {meta['preset']['warmup']}, cosine to 10%, "
        f"bf16 autocast on cuda), {tr['seconds']:.0f} s; router bias balancing at speed {BIAS_UPDATE}.",
        f"Final training loss (mean of the last {tr['final_loss_steps']} steps) {tr['final_loss']:.4f} nats/byte; held-out loss {ev['target_heldout_loss']:.4f} nats/byte "
        f"({ev['target_heldout_loss'] / math.log(2):.3f} bits/byte), on {meta['preset']['eval_windows']} held-out windows, "
        f"weights as stored. Router load max/mean at the end: {tr['router_max_over_mean_load']}.",
        "",
        "## Drafter",
        "",
        f"DFlash, {dm['params'] / 1e6:.2f} M parameters (no embedding or head of its own: the target's): "
        f"{dc['num_hidden_layers']} non-causal Qwen3-style layers, hidden {dc['hidden_size']}, "
        f"{dc['num_attention_heads']} query / {dc['num_key_value_heads']} KV heads of {dc['head_dim']}, "
        f"MLP {dc['intermediate_size']}, block {dc['block_size']}, MASK {MASK}, reading target layers "
        f"{dc['dflash_config']['target_layer_ids']} as the reference DFlash code does (HF `hidden_states[i + 1]`: "
        f"layer i's output, final-normed for the target's last layer). Stored {meta['export_dtype']}.",
        f"Data: {meta['pool']['train']} greedy continuations by the stored target ({meta['preset']['prefix']} "
        f"training-text bytes, then {meta['preset']['seq_len'] - meta['preset']['prefix']} greedy tokens; "
        f"{meta['pool']['seconds']:.0f} s; the cached generation agreed with the full forward's argmax on "
        f"{100 * meta['pool']['greedy_agreement']:.2f}% of tokens).",
        f"Training: {dr['steps']} steps of {meta['preset']['d_batch']} sequences x {meta['preset']['anchors']} random "
        f"anchors in the greedy part, block `[token, MASK x 15]`, cross-entropy on the 15 masked positions against "
        f"the target's greedy tokens (AdamW, lr {meta['preset']['d_lr']}, warmup {meta['preset']['d_warmup']}, "
        f"cosine to 10%), {dr['seconds']:.0f} s. "
        f"Final training loss (mean of the last {dr['final_loss_steps']} steps) {dr['final_loss']:.4f}."
        + _warm_start_line(dr),
        f"Held out ({meta['pool']['heldout']} greedy continuations of held-out prefixes, {ev['drafter']['anchors']} anchors): "
        f"loss {ev['drafter']['loss']:.4f}; top-1 accuracy by depth {ev['drafter']['top1_by_depth']}; "
        f"DFlash chain acceptance length (1 + leading correct drafts) {ev['drafter']['chain_acceptance']}, "
        "averaged over random anchors in those continuations: a training metric, not comparable with the "
        "per-round acceptance of decoding below.",
        "",
        "## Check",
        "",
    ]
    ck = meta.get("check")
    if ck:
        qa = ck["quick_acceptance"]
        lines += [
            f"The package loads both: numpy target logits vs HF on the stored weights, relative error "
            f"{ck['target_logits_rel_err']:.1e}; numpy drafter vs the torch module {ck['drafter_hidden_rel_err']:.1e}. "
            f"On one held-out prompt, {qa['tokens']} tokens: ddtree (budget {qa['budget']}) == ar: "
            f"{ck['ddtree_equals_ar']}, dflash == ar: {ck['dflash_equals_ar']}; mean acceptance length "
            f"ddtree {qa['ddtree']}, dflash {qa['dflash']} (one prompt, a sanity check only). "
            f"{'Passed.' if ck['passed'] else 'FAILED.'}",
        ]
    elif meta.get("check_skipped"):
        lines.append("Skipped (`--no-check`).")
    else:
        lines.append("Not run yet (the card is written before the check; a card left like this means the check died).")
    lines += [
        "",
        "## Acceptance",
        "",
        "To be filled in by `python tools/record_acceptance.py STATS.json` from a `ddtree-numba sweep` of the pair "
        "on the held-out prompts in `demo.json`.",
        "",
        f"Size: target {meta['bytes']['target'] / 1e6:.2f} MB, drafter {meta['bytes']['drafter'] / 1e6:.2f} MB.",
        "",
    ]
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------
def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--out", default=DEFAULT_OUT, help="output directory (default ddtree_numba/data/demo)")
    ap.add_argument("--minutes", type=float, default=13.0,
                    help="wall-clock budget for the whole run when step counts are left out (default 13)")
    ap.add_argument("--target-share", type=float, default=0.55,
                    help="share of the budget for the target's training (default 0.55)")
    ap.add_argument("--target-steps", type=int, default=None, help="fixed target steps (default: fit the budget)")
    ap.add_argument("--drafter-steps", type=int, default=None, help="fixed drafter steps (default: fit the budget)")
    ap.add_argument("--stage", choices=("all", "target", "drafter"), default="all",
                    help="all (default); or target, then drafter with the same --out, as two runs of --minutes each "
                         "(for machines that cap one command's time)")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes and a few steps: seconds on a CPU")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dtype", choices=sorted(EXPORT_DTYPES), default="bf16", help="export dtype (default bf16)")
    ap.add_argument("--heldout-mod", type=int, default=16,
                    help="hold out modules whose path's sha1 is 0 mod this (default 16, about 6%%)")
    ap.add_argument("--no-tests", action="store_true", help="leave the stdlib's test files out of training")
    ap.add_argument("--pool", type=int, default=None, help="greedy continuations for the drafter (preset default)")
    ap.add_argument("--init-drafter", default=None, metavar="DIR",
                    help="--stage drafter only: start from the drafter exported in DIR (config.json + "
                         "model.safetensors, e.g. ddtree_numba/data/demo/drafter) instead of a fresh one")
    ap.add_argument("--drafter-lr", type=float, default=None,
                    help="the drafter's peak learning rate (default: the preset's, 1e-3; smoke 3e-3)")
    ap.add_argument("--drafter-warmup", type=int, default=None,
                    help="the drafter's warmup steps (default: the preset's, 200; smoke 4); with --minutes, "
                         "steps 3 .. min(warmup, 30) - 1 are timed to fix the step count (30 or more: 27 timed)")
    ap.add_argument("--drafter-layers", default=None,
                    help="comma-separated target layers the drafter reads (default: 3 spread over 1 .. L-1)")
    ap.add_argument("--experts-impl", default=None,
                    help="transformers experts implementation (eager, grouped_mm, batched_mm; default: HF's choice)")
    ap.add_argument("--no-check", action="store_true", help="skip loading the export with the package")
    ap.add_argument("--quick-tokens", type=int, default=None, help="tokens generated by the check (default 64; smoke 12)")
    args = ap.parse_args(argv)
    if args.init_drafter is not None:
        if args.stage != "drafter":
            ap.error(f"--init-drafter needs --stage drafter (not --stage {args.stage}): it warm-starts the drafter "
                     "of a target already trained in --out")
        missing = [f for f in ("config.json", "model.safetensors")
                   if not os.path.isfile(os.path.join(args.init_drafter, f))]
        if missing:
            ap.error(f"--init-drafter {args.init_drafter} has no {' and no '.join(missing)}")
    if args.stage == "target" and (args.drafter_lr is not None or args.drafter_warmup is not None):
        ap.error("--drafter-lr / --drafter-warmup: --stage target trains no drafter")
    if args.drafter_lr is not None and not args.drafter_lr > 0:
        ap.error(f"--drafter-lr must be > 0, got {args.drafter_lr}")
    if args.drafter_warmup is not None and args.drafter_warmup < 0:
        ap.error(f"--drafter-warmup must be >= 0, got {args.drafter_warmup}")
    return args


STAGE_FILE = "target_stage.json"        # what --stage target hands to --stage drafter


def _repeat_flags(args):
    """The flags (besides device, seed, steps, stage) that a repeat of this run needs."""
    flags = [f"--dtype {args.dtype}"]
    if args.smoke:
        flags.append("--smoke")
    if args.out != DEFAULT_OUT:
        flags.append(f"--out {args.out}")
    for flag, on in (("--no-tests", args.no_tests), ("--no-check", args.no_check)):
        if on:
            flags.append(flag)
    if args.heldout_mod != 16:
        flags.append(f"--heldout-mod {args.heldout_mod}")
    if args.pool:
        flags.append(f"--pool {args.pool}")
    if args.drafter_layers:
        flags.append(f"--drafter-layers {args.drafter_layers}")
    if args.drafter_lr is not None:
        flags.append(f"--drafter-lr {args.drafter_lr:g}")
    if args.drafter_warmup is not None:
        flags.append(f"--drafter-warmup {args.drafter_warmup}")
    if args.experts_impl:
        flags.append(f"--experts-impl {args.experts_impl}")
    return flags


def _command(argv):
    return "python tools/train_demo.py " + " ".join(sys.argv[1:] if argv is None else argv)


def target_stage(args, p, device, dtype, budget_s, argv):
    """Data, the target's training, rounding and held-out loss. Returns (target, record)."""
    t0 = time.perf_counter()
    train, held, held_files, held_names, data_info = collect_corpus(args.heldout_mod, not args.no_tests)
    log(f"corpus: {data_info['train_files']} train files ({data_info['train_bytes'] / 1e6:.1f} MB), "
        f"{data_info['heldout_files']} held out ({data_info['heldout_bytes'] / 1e6:.2f} MB)")
    prompts = demo_prompts(held_files, held_names, np.random.default_rng([args.seed, 3]), p["prompts"], p["prompt_bytes"])
    if not prompts:
        raise SystemExit("no held-out module is long enough for a demo prompt; lower --heldout-mod")
    tc = p["target"]
    torch.manual_seed(args.seed)
    target = build_target(tc).to(device)
    experts_impl = set_experts_impl(target, args.experts_impl, device)
    log(f"target: {count_params(target) / 1e6:.2f} M parameters, experts implementation {experts_impl}")
    rng = np.random.default_rng([args.seed, 1])
    t_stats = train_target(target, train, rng, p, args, device, budget_s - (time.perf_counter() - t0))
    round_weights(target, dtype)
    for q in target.parameters():
        q.requires_grad_(False)
    heldout_loss = eval_target(target, held, p, args.seed, device)
    log(f"target: final train loss {t_stats['final_loss']:.4f}, held-out {heldout_loss:.4f} nats/byte")
    record = dict(command=_command(argv), date=time.strftime("%Y-%m-%d"), device=_device_name(device),
                  torch=torch.__version__, transformers=transformers.__version__, seed=args.seed,
                  smoke=args.smoke, export_dtype=args.dtype, data=data_info, prompts=prompts,
                  experts_implementation=experts_impl, training=t_stats, heldout_loss=heldout_loss,
                  params=count_params(target), config=tc, seconds=round(time.perf_counter() - t0, 1),
                  stage_flags=_stage_flags(args),
                  repeat=" ".join(["python tools/train_demo.py", f"--device {args.device}", f"--seed {args.seed}",
                                   f"--target-steps {t_stats['steps']}"] + _repeat_flags(args)))
    return target, (train, held), record


def _stage_flags(args):
    """The flags both stages must share: they decide the data split, the target and its dtype."""
    return dict(smoke=args.smoke, seed=args.seed, heldout_mod=args.heldout_mod, no_tests=args.no_tests,
                dtype=args.dtype)


def stage_record_from_demo(meta: dict) -> dict:
    """The target stage's record, read back from a finished pair's ``demo.json`` (to train its
    drafter again against the same target)."""
    first = lambda command: command.split(", then ")[0]                          # noqa: E731
    data = meta["data"]
    heldout_mod = int(data["heldout_rule"].split("% ")[1].split(" ")[0])
    return dict(command=first(meta["command"]), repeat=first(meta["repeat_command"]).removesuffix(" --stage target"),
                date=meta["date"], device=meta["device"], torch=meta["torch"], transformers=meta["transformers"],
                seed=meta["seed"], smoke=meta["smoke"], export_dtype=meta["export_dtype"], data=data,
                prompts=meta["prompts"], experts_implementation=meta["experts_implementation"],
                training=meta["training"]["target"], heldout_loss=meta["eval"]["target_heldout_loss"],
                params=meta["target"]["params"], config=meta["target"]["config"],
                seconds=meta.get("target_stage_seconds", meta["training"]["target"]["seconds"]),
                stage_flags=dict(smoke=meta["smoke"], seed=meta["seed"], heldout_mod=heldout_mod,
                                 no_tests=not data["include_tests"], dtype=meta["export_dtype"]))


def load_stage_target(out, args, device):
    """The target written by ``--stage target`` (as stored: its rounded weights), its record (from
    ``target_stage.json``, or from a finished pair's ``demo.json``: a new drafter for the same
    target), and the corpus, which must be the one it was trained on."""
    stage_path, demo_path = os.path.join(out, STAGE_FILE), os.path.join(out, "demo.json")
    path = stage_path if os.path.isfile(stage_path) else demo_path
    if not (os.path.isfile(os.path.join(out, "target", "config.json")) and os.path.isfile(path)):
        raise SystemExit(f"--stage drafter needs the output of --stage target in {out} ({STAGE_FILE} and target/)")
    with open(path) as f:
        record = json.load(f)
    if path == demo_path:
        record = stage_record_from_demo(record)
    want, have = record.get("stage_flags", {}), _stage_flags(args)
    differ = {k: (want.get(k), v) for k, v in have.items() if want.get(k) != v}
    if differ:
        raise SystemExit(f"{path} was made with other flags than this run: "
                         + ", ".join(f"{k}={a!r} there, {b!r} here" for k, (a, b) in differ.items())
                         + "; give --stage drafter the target stage's --seed/--smoke/--heldout-mod/--no-tests/--dtype")
    train, held, _, _, data_info = collect_corpus(args.heldout_mod, not args.no_tests)
    if data_info["corpus_sha256"] != record["data"]["corpus_sha256"]:
        raise SystemExit(f"the corpus here (Python {data_info['python_version']}) is not the one the target was "
                         f"trained on (Python {record['data']['python_version']}); run both stages on one machine")
    target = DeepseekV3ForCausalLM.from_pretrained(os.path.join(out, "target"), dtype=torch.float32).to(device).eval()
    set_experts_impl(target, args.experts_impl or record["experts_implementation"], device)
    for q in target.parameters():
        q.requires_grad_(False)
    log(f"target: loaded from {out}/target ({record['params'] / 1e6:.2f} M parameters, "
        f"held-out {record['heldout_loss']:.4f} nats/byte)")
    return target, (train, held), record


def _device_name(device):
    return torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu ({platform.processor() or platform.machine()})"


def main(argv=None):
    args = parse_args(argv)
    t_start = time.perf_counter()
    preset_name = "smoke" if args.smoke else "full"
    p = dict(PRESETS[preset_name])
    if args.pool:
        p["pool"] = args.pool
    if args.drafter_lr is not None:                          # the preset records what was used
        p["d_lr"] = args.drafter_lr
    if args.drafter_warmup is not None:
        p["d_warmup"] = args.drafter_warmup
    if args.smoke:
        args.target_steps = args.target_steps or p["target_steps"]
        args.drafter_steps = args.drafter_steps or p["drafter_steps"]
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda but torch sees no CUDA device")
    torch.manual_seed(args.seed)
    torch.backends.cuda.matmul.allow_tf32 = False            # float32 stays float32 (greedy data, checks)
    torch.backends.cudnn.allow_tf32 = False
    budget = args.minutes * 60.0
    dtype = EXPORT_DTYPES[args.dtype]
    out = os.path.abspath(args.out)
    log(f"python {platform.python_version()}, torch {torch.__version__}, transformers {transformers.__version__}, "
        f"device {device}, preset {preset_name}, stage {args.stage}")

    tc = p["target"]
    layers = tc["num_hidden_layers"]
    if args.drafter_layers:
        layer_ids = sorted({int(s) for s in args.drafter_layers.split(",")})
    else:
        layer_ids = sorted({int(round(x)) for x in np.linspace(1, layers - 1, 3)}) if layers > 1 else [0]
    if not all(0 <= i < layers for i in layer_ids):
        raise SystemExit(f"--drafter-layers {layer_ids} outside the target's {layers} layers")
    dc = p["drafter"]
    m = tc["hidden_size"]
    d_config = drafter_config_dict(m, dc, layer_ids, layers)
    init = init_state = None
    if args.init_drafter:
        # checked and read before the target and the greedy pool (minutes on a GPU), so a wrong DIR
        # fails at once, and before anything is written (DIR may be --out's own drafter)
        with torch.device("meta"):                       # the shapes only: no memory, no random draws
            shapes = {n: tuple(t.shape) for n, t in DFlashDrafter(m, len(layer_ids), **dc).state_dict().items()}
        try:
            init_state = read_init_drafter(args.init_drafter, d_config, shapes)
        except ValueError as e:
            raise SystemExit(f"--init-drafter: {e}") from None
        init = init_provenance(args.init_drafter, d_config)

    # 1. target (trained here, or read back from --stage target's output)
    if args.stage == "drafter":
        target, (train, held), t_rec = load_stage_target(out, args, device)
        if init is not None:
            init["same_target"] = same_target(init, t_rec)
            if init["same_target"] is False:
                log(f"--init-drafter: {args.init_drafter} was trained against another target than {out}/target")
    else:
        share = 1.0 if args.stage == "target" else args.target_share
        target, (train, held), t_rec = target_stage(args, p, device, dtype, budget * share - 20.0 * (share == 1.0), argv)
        shutil.rmtree(os.path.join(out, "target"), ignore_errors=True)
        export_target(target.float().cpu(), os.path.join(out, "target"), dtype)
        target.to(device)
        if args.stage == "target":
            with open(os.path.join(out, STAGE_FILE), "w") as f:
                json.dump(t_rec, f, indent=1)
            log(f"wrote {out}/target ({dir_bytes(os.path.join(out, 'target')) / 1e6:.2f} MB) and {STAGE_FILE} "
                f"in {time.perf_counter() - t_start:.0f} s; next: --stage drafter with the same --out")
            return t_rec
    prompts = t_rec["prompts"]

    # 2. greedy continuations
    t0 = time.perf_counter()
    rng_pool = np.random.default_rng([args.seed, 2])
    pool = greedy_pool(target, train, rng_pool, p["pool"], p, device)
    eval_pool = greedy_pool(target, held, rng_pool, p["eval_pool"], p, device)
    agree = []
    with torch.no_grad():
        for i in range(0, len(pool), 64):
            s = pool[i:i + 64].to(device)
            nxt = target(input_ids=s, use_cache=False).logits.argmax(-1)
            agree.append((nxt[:, p["prefix"] - 1:-1] == s[:, p["prefix"]:]).float().mean().item())
            if i >= 512:
                break
    pool_info = dict(train=len(pool), heldout=len(eval_pool), seconds=round(time.perf_counter() - t0, 1),
                     greedy_agreement=float(np.mean(agree)))
    log(f"pool: {len(pool)} + {len(eval_pool)} continuations in {pool_info['seconds']:.0f} s, "
        f"greedy agreement {pool_info['greedy_agreement']:.4f}")

    # 3. drafter
    torch.manual_seed(args.seed + 1)
    drafter = DFlashDrafter(m, len(layer_ids), **dc).to(device)
    log(f"drafter: {count_params(drafter) / 1e6:.2f} M parameters, reading target layers {layer_ids}")
    if init is not None:
        # the fresh drafter's random weights are all replaced (strict: every parameter, checked shapes);
        # the seeds of the pool, anchors and held-out set are a fresh run's
        drafter.load_state_dict(init_state, strict=True)
        init["heldout_before"] = eval_drafter(drafter, target, eval_pool, layer_ids, p, args.seed, device)
        log(f"drafter: warm start from {args.init_drafter} ({init.get('total_steps', '?')} steps before), "
            f"held-out before this run {init['heldout_before']}")
    reserve = 20.0 if args.no_check else 90.0
    d_budget = budget - (time.perf_counter() - t_start) - reserve
    d_stats = train_drafter(drafter, target, pool, layer_ids, np.random.default_rng([args.seed, 4]), p, args,
                            device, max(d_budget, 30.0))
    if init is not None:
        d_stats["total_steps"] = init["total_steps"] + d_stats["steps"] if init["card"] else None
        d_stats["warm_start"] = init
    # evaluate the drafter as stored
    round_weights(drafter, dtype, skip=lambda n: False)
    d_eval = eval_drafter(drafter, target, eval_pool, layer_ids, p, args.seed, device)
    log(f"drafter: final train loss {d_stats['final_loss']:.4f}, held-out {d_eval}")

    # 4. export (the target is already written)
    shutil.rmtree(os.path.join(out, "drafter"), ignore_errors=True)
    drafter_cpu = drafter.float().cpu()
    export_drafter(drafter_cpu, os.path.join(out, "drafter"), dtype, d_config)
    sizes = {k: dir_bytes(os.path.join(out, k)) for k in ("target", "drafter")}
    if sum(sizes.values()) > SIZE_LIMIT:
        raise SystemExit(f"checkpoints are {sum(sizes.values()) / 1e6:.1f} MB, over the {SIZE_LIMIT / 1e6:.0f} MB limit")

    d_repeat = " ".join(["python tools/train_demo.py", f"--device {args.device}", f"--seed {args.seed}"]
                        + ([f"--target-steps {t_rec['training']['steps']}"] if args.stage == "all" else ["--stage drafter"])
                        + ([f"--init-drafter {args.init_drafter}"] if init else [])
                        + [f"--drafter-steps {d_stats['steps']}"] + _repeat_flags(args))
    staged = args.stage == "drafter"
    # a warm start against the same target continues its card's runs: the commands chain theirs
    chained = bool(init and init["same_target"])
    meta = dict(
        command=(f"{init['command']}, then {_command(argv)}" if chained
                 else f"{t_rec['command']}, then {_command(argv)}" if staged else _command(argv)),
        repeat_command=(f"{init['repeat_command']}, then {d_repeat}" if chained
                        else f"{t_rec['repeat']} --stage target, then {d_repeat}" if staged else d_repeat),
        date=time.strftime("%Y-%m-%d"), device=_device_name(device),
        torch=torch.__version__, transformers=transformers.__version__, seed=args.seed, smoke=args.smoke,
        export_dtype=args.dtype, preset={k: v for k, v in p.items() if k not in ("target", "drafter")},
        specials=SPECIALS, vocab_size=VOCAB, experts_implementation=t_rec["experts_implementation"],
        data=t_rec["data"], prompts=prompts,
        target=dict(params=t_rec["params"], config=tc),
        drafter=dict(params=count_params(drafter_cpu), config=d_config),
        training=dict(target=t_rec["training"], drafter=d_stats), pool=pool_info,
        eval=dict(target_heldout_loss=t_rec["heldout_loss"],
                  target_heldout_bits_per_byte=t_rec["heldout_loss"] / math.log(2), drafter=d_eval),
        bytes=sizes, check_skipped=args.no_check, target_stage_seconds=t_rec["seconds"])
    prior_seconds = ((init["total_seconds"] or t_rec["seconds"] + init["seconds"]) if chained
                     else t_rec["seconds"] if staged else 0.0)

    def write(meta):
        meta["total_seconds"] = round(prior_seconds + time.perf_counter() - t_start, 1)
        with open(os.path.join(out, "demo.json"), "w") as f:
            json.dump(meta, f, indent=1)
        with open(os.path.join(out, "MODEL_CARD.md"), "w") as f:
            f.write(model_card(meta))

    write(meta)                      # written before the check, so a failed check loses nothing
    if staged and os.path.isfile(os.path.join(out, STAGE_FILE)):
        os.remove(os.path.join(out, STAGE_FILE))        # folded into demo.json
    # 5. check with the package
    if not args.no_check:
        quick = args.quick_tokens or (12 if args.smoke else 64)
        meta["check"] = check_export(out, drafter_cpu, layer_ids, prompts[0]["ids"], quick,
                                     8 if args.smoke else 64)
        log(f"check: {meta['check']}")
        write(meta)
        if not meta["check"]["passed"]:
            raise SystemExit(f"check failed: {meta['check']}")
    log(f"wrote {out} ({sum(sizes.values()) / 1e6:.2f} MB of weights) in {meta['total_seconds']:.0f} s")
    return meta


if __name__ == "__main__":
    main()
