"""Train rlx-lm's default model: byte-level BPE tokenizer + a small Llama, on the CPU, with JAX.

Stages (each reads the previous stage's output from --work, default build/):

    python tools/train_default_model.py tokenizer   # build/tokenizer.json from build/corpus/*.txt
    python tools/train_default_model.py train       # build/ckpt/*.npz, log in build/train.log
    python tools/train_default_model.py export      # python/rlx_lm/models/default.gguf
    python tools/train_default_model.py sample      # greedy + sampled text from the GGUF (numpy)

`train` resumes from the newest checkpoint in build/ckpt, so it can be stopped at any time and
restarted; `--budget-minutes` stops it early (the model card records the step it reached).
Everything is seeded (--seed): the batch order and initial weights depend only on the seed.

RoPE convention: the model rotates *adjacent* pairs (x[2i], x[2i+1]) of each head, which is the
GGUF/llama.cpp convention for architecture "llama". The q/k weights are therefore written to the
GGUF as trained, with NO row permutation (that permutation exists only to convert Hugging Face
checkpoints trained with the rotate-half convention).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
BOS, EOS = "<s>", "</s>"


@dataclass(frozen=True)
class Config:
    """Model geometry and training hyper-parameters (recorded in the model card)."""

    vocab_size: int = 4096
    dim: int = 256
    n_layers: int = 4
    n_heads: int = 4
    n_kv_heads: int = 2
    ffn_dim: int = 704
    ctx: int = 256
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    batch: int = 8
    steps: int = 1600
    lr: float = 3e-3
    min_lr_frac: float = 0.1
    warmup: int = 100
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    seed: int = 1234

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads


# ----------------------------------------------------------------------------- tokenizer


def train_tokenizer(corpus: Path, vocab_size: int, out: Path) -> None:
    """Byte-level BPE (GPT-2 pre-tokenisation regex) with <s> and </s> as ids 0 and 1."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=[BOS, EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train([str(corpus / "train.txt")], trainer)
    tok.save(str(out))
    print(f"tokenizer: {tok.get_vocab_size()} tokens -> {out}")


def encode_corpus(tok_path: Path, corpus: Path, split: str) -> tuple[np.ndarray, np.ndarray]:
    """Token stream of one split (paragraphs joined by newlines) and the paragraph start offsets."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tok_path))
    paras = (corpus / f"{split}.txt").read_text(encoding="utf-8").splitlines()
    encs = tok.encode_batch([p + "\n" for p in paras])
    ids = [np.asarray(e.ids, dtype=np.int32) for e in encs]
    starts = np.cumsum([0] + [len(x) for x in ids[:-1]]).astype(np.int64)
    return np.concatenate(ids), starts


# ----------------------------------------------------------------------------- model (JAX)


def init_params(cfg: Config, key: Any) -> dict[str, Any]:
    import jax
    import jax.numpy as jnp

    std = 0.02
    out_std = std / math.sqrt(2 * cfg.n_layers)
    keys = iter(jax.random.split(key, 1 + 7 * cfg.n_layers))

    def normal(shape: tuple[int, ...], s: float) -> Any:
        return s * jax.random.normal(next(keys), shape, dtype=jnp.float32)

    hd, d = cfg.head_dim, cfg.dim
    params: dict[str, Any] = {"tok_emb": normal((cfg.vocab_size, d), std)}
    layers = []
    for _ in range(cfg.n_layers):
        layers.append(
            {
                "attn_norm": jnp.ones((d,), jnp.float32),
                "wq": normal((d, cfg.n_heads * hd), std),
                "wk": normal((d, cfg.n_kv_heads * hd), std),
                "wv": normal((d, cfg.n_kv_heads * hd), std),
                "wo": normal((cfg.n_heads * hd, d), out_std),
                "ffn_norm": jnp.ones((d,), jnp.float32),
                "w_gate": normal((d, cfg.ffn_dim), std),
                "w_up": normal((d, cfg.ffn_dim), std),
                "w_down": normal((cfg.ffn_dim, d), out_std),
            }
        )
    params["layers"] = layers
    params["out_norm"] = jnp.ones((d,), jnp.float32)
    return params


def rope_tables(cfg: Config, n: int) -> tuple[np.ndarray, np.ndarray]:
    """cos/sin of shape (n, head_dim/2) for adjacent-pair RoPE."""
    inv = cfg.rope_theta ** (-np.arange(0, cfg.head_dim, 2, dtype=np.float64) / cfg.head_dim)
    ang = np.arange(n, dtype=np.float64)[:, None] * inv[None, :]
    return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)


def forward(params: dict[str, Any], tokens: Any, cfg: Config, cos: Any, sin: Any) -> Any:
    """Logits (B, T, V) for token ids (B, T)."""
    import jax
    import jax.numpy as jnp

    b, t = tokens.shape
    hd = cfg.head_dim
    group = cfg.n_heads // cfg.n_kv_heads

    def rms(x: Any, w: Any) -> Any:
        return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + cfg.norm_eps) * w

    def rope(x: Any) -> Any:  # x: (B, T, H, hd); rotate pairs (2i, 2i+1)
        x2 = x.reshape(*x.shape[:-1], hd // 2, 2)
        a, c = x2[..., 0], x2[..., 1]
        cs, sn = cos[:t, None, :], sin[:t, None, :]
        return jnp.stack([a * cs - c * sn, a * sn + c * cs], axis=-1).reshape(x.shape)

    mask = jnp.tril(jnp.ones((t, t), dtype=bool))
    x = params["tok_emb"][tokens]
    for lp in params["layers"]:
        h = rms(x, lp["attn_norm"])
        q = rope((h @ lp["wq"]).reshape(b, t, cfg.n_heads, hd))
        k = rope((h @ lp["wk"]).reshape(b, t, cfg.n_kv_heads, hd))
        v = (h @ lp["wv"]).reshape(b, t, cfg.n_kv_heads, hd)
        k = jnp.repeat(k, group, axis=2)
        v = jnp.repeat(v, group, axis=2)
        att = jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(hd)
        att = jnp.where(mask[None, None], att, -1e30)
        att = jax.nn.softmax(att, axis=-1)
        o = jnp.einsum("bhqk,bkhd->bqhd", att, v).reshape(b, t, cfg.n_heads * hd)
        x = x + o @ lp["wo"]
        h = rms(x, lp["ffn_norm"])
        x = x + (jax.nn.silu(h @ lp["w_gate"]) * (h @ lp["w_up"])) @ lp["w_down"]
    x = rms(x, params["out_norm"])
    return x @ params["tok_emb"].T


def make_batch(
    stream: np.ndarray, starts: np.ndarray, rng: np.random.Generator, batch: int, ctx: int, bos: int
) -> np.ndarray:
    """(batch, ctx+1) windows: BOS then text from a random paragraph start."""
    ok = starts[starts + ctx <= len(stream)]
    picks = rng.choice(ok, size=batch)
    out = np.empty((batch, ctx + 1), dtype=np.int32)
    out[:, 0] = bos
    for i, s in enumerate(picks):
        out[i, 1:] = stream[s : s + ctx]
    return out


# ----------------------------------------------------------------------------- training


def lr_at(step: int, cfg: Config) -> float:
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    frac = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    cos = 0.5 * (1 + math.cos(math.pi * min(1.0, frac)))
    return cfg.lr * (cfg.min_lr_frac + (1 - cfg.min_lr_frac) * cos)


def flatten(tree: dict[str, Any]) -> dict[str, np.ndarray]:
    flat = {k: np.asarray(tree[k]) for k in ("tok_emb", "out_norm")}
    for i, lp in enumerate(tree["layers"]):
        for k, v in lp.items():
            flat[f"layers.{i}.{k}"] = np.asarray(v)
    return flat


def unflatten(flat: dict[str, np.ndarray], n_layers: int) -> dict[str, Any]:
    import jax.numpy as jnp

    tree: dict[str, Any] = {k: jnp.asarray(flat[k]) for k in ("tok_emb", "out_norm")}
    tree["layers"] = []
    for i in range(n_layers):
        prefix = f"layers.{i}."
        tree["layers"].append(
            {k[len(prefix) :]: jnp.asarray(v) for k, v in flat.items() if k.startswith(prefix)}
        )
    return tree


def save_ckpt(
    path: Path, step: int, params: Any, m: Any, v: Any, rng_state: dict[str, Any]
) -> None:
    arrays = {f"p/{k}": a for k, a in flatten(params).items()}
    arrays |= {f"m/{k}": a for k, a in flatten(m).items()}
    arrays |= {f"v/{k}": a for k, a in flatten(v).items()}
    tmp = path.with_suffix(".tmp.npz")
    np.savez(
        tmp,
        step=np.int64(step),
        rng=np.frombuffer(json.dumps(rng_state).encode(), np.uint8),
        **arrays,
    )
    tmp.replace(path)


def load_ckpt(path: Path, n_layers: int) -> tuple[int, Any, Any, Any, dict[str, Any]]:
    z = np.load(path)
    parts: dict[str, dict[str, np.ndarray]] = {"p": {}, "m": {}, "v": {}}
    for key in z.files:
        if "/" in key:
            kind, name = key.split("/", 1)
            parts[kind][name] = z[key]
    rng_state = json.loads(bytes(z["rng"]).decode())
    return (
        int(z["step"]),
        unflatten(parts["p"], n_layers),
        unflatten(parts["m"], n_layers),
        unflatten(parts["v"], n_layers),
        rng_state,
    )


def train(cfg: Config, work: Path, budget_minutes: float, log_every: int, ckpt_every: int) -> None:
    import jax
    import jax.numpy as jnp

    tok_path = work / "tokenizer.json"
    train_ids, train_starts = encode_corpus(tok_path, work / "corpus", "train")
    valid_ids, valid_starts = encode_corpus(tok_path, work / "corpus", "valid")
    bos = 0
    print(f"train tokens {len(train_ids)}, valid tokens {len(valid_ids)}", flush=True)

    cos_np, sin_np = rope_tables(cfg, cfg.ctx + 1)
    cos, sin = jnp.asarray(cos_np), jnp.asarray(sin_np)

    def loss_fn(params: Any, batch: Any) -> Any:
        logits = forward(params, batch[:, :-1], cfg, cos, sin)
        logp = jax.nn.log_softmax(logits, axis=-1)
        nll = -jnp.take_along_axis(logp, batch[:, 1:, None], axis=-1)[..., 0]
        return jnp.mean(nll)

    def decay_mask(path: str) -> bool:
        return not path.endswith("norm")

    @jax.jit
    def step_fn(params: Any, m: Any, v: Any, batch: Any, lr: Any, t: Any) -> Any:
        loss, grads = jax.value_and_grad(loss_fn)(params, batch)
        gnorm = jnp.sqrt(sum(jnp.sum(g * g) for g in jax.tree_util.tree_leaves(grads)))
        scale = jnp.minimum(1.0, cfg.grad_clip / (gnorm + 1e-6))
        b1, b2, eps = 0.9, 0.95, 1e-8

        def upd(path: Any, p: Any, g: Any, mm: Any, vv: Any) -> Any:
            g = g * scale
            mm = b1 * mm + (1 - b1) * g
            vv = b2 * vv + (1 - b2) * g * g
            mhat = mm / (1 - b1**t)
            vhat = vv / (1 - b2**t)
            name = jax.tree_util.keystr(path)
            wd = cfg.weight_decay if decay_mask(name.rstrip("']")) else 0.0
            p = p - lr * (mhat / (jnp.sqrt(vhat) + eps) + wd * p)
            return p, mm, vv

        out = jax.tree_util.tree_map_with_path(upd, params, grads, m, v)
        is_triple = lambda x: isinstance(x, tuple)  # noqa: E731
        new_p = jax.tree_util.tree_map(lambda x: x[0], out, is_leaf=is_triple)
        new_m = jax.tree_util.tree_map(lambda x: x[1], out, is_leaf=is_triple)
        new_v = jax.tree_util.tree_map(lambda x: x[2], out, is_leaf=is_triple)
        return new_p, new_m, new_v, loss, gnorm

    eval_loss = jax.jit(loss_fn)

    ckdir = work / "ckpt"
    ckdir.mkdir(parents=True, exist_ok=True)
    latest = ckdir / "latest.npz"
    if latest.exists():
        step, params, m, v, rng_state = load_ckpt(latest, cfg.n_layers)
        rng = np.random.default_rng()
        rng.bit_generator.state = rng_state
        print(f"resumed at step {step}", flush=True)
    else:
        step = 0
        params = init_params(cfg, jax.random.PRNGKey(cfg.seed))
        m = jax.tree_util.tree_map(jnp.zeros_like, params)
        v = jax.tree_util.tree_map(jnp.zeros_like, params)
        rng = np.random.default_rng(cfg.seed)
    n_params = sum(int(np.prod(p.shape)) for p in jax.tree_util.tree_leaves(params))
    print(f"params {n_params}", flush=True)

    # A fixed validation set: non-overlapping windows from the valid split, same format as train.
    vrng = np.random.default_rng(cfg.seed + 1)
    vbatches = [
        make_batch(valid_ids, valid_starts, vrng, cfg.batch, cfg.ctx, bos) for _ in range(8)
    ]

    def validate(p: Any) -> float:
        return float(np.mean([float(eval_loss(p, jnp.asarray(b))) for b in vbatches]))

    t0 = time.time()
    budget_s = budget_minutes * 60
    elapsed_before = 0.0
    meta_path = work / "train_meta.json"
    if meta_path.exists() and step > 0:
        elapsed_before = json.loads(meta_path.read_text())["wall_seconds"]
    losses: list[float] = []
    while step < cfg.steps:
        batch = make_batch(train_ids, train_starts, rng, cfg.batch, cfg.ctx, bos)
        params, m, v, loss, gnorm = step_fn(
            params, m, v, jnp.asarray(batch), jnp.float32(lr_at(step, cfg)), jnp.float32(step + 1)
        )
        step += 1
        losses.append(float(loss))
        wall = elapsed_before + time.time() - t0
        if step % log_every == 0 or step == cfg.steps:
            print(
                f"step {step} loss {np.mean(losses[-log_every:]):.4f} gnorm {float(gnorm):.3f} "
                f"lr {lr_at(step - 1, cfg):.2e} wall {wall:.0f}s",
                flush=True,
            )
        stop = time.time() - t0 > budget_s
        if step % ckpt_every == 0 or step == cfg.steps or stop:
            vl = validate(params)
            train_recent = float(np.mean(losses[-log_every:]))
            print(f"step {step} valid {vl:.4f} (ppl {math.exp(vl):.2f})", flush=True)
            save_ckpt(latest, step, params, m, v, rng.bit_generator.state)
            best_path = work / "best_meta.json"
            if not best_path.exists() or vl < json.loads(best_path.read_text())["valid_loss"]:
                save_ckpt(ckdir / "best.npz", step, params, m, v, rng.bit_generator.state)
                best_path.write_text(json.dumps({"step": step, "valid_loss": vl}))
            meta = {
                "step": step,
                "train_loss": train_recent,
                "valid_loss": vl,
                "wall_seconds": wall,
                "n_params": n_params,
                "config": asdict(cfg),
                "train_tokens": len(train_ids),
                "valid_tokens": len(valid_ids),
            }
            meta_path.write_text(json.dumps(meta, indent=2))
        if stop:
            print(f"wall-time budget reached at step {step}", flush=True)
            break


# ----------------------------------------------------------------------------- export


def export_gguf(cfg: Config, work: Path, out: Path, qtype: str, ckpt: str) -> None:
    """Write the checkpoint as a llama.cpp-style GGUF with the tokenizer embedded."""
    import gguf

    _, params, _, _, _ = load_ckpt(work / "ckpt" / f"{ckpt}.npz", cfg.n_layers)
    flat = flatten(params)
    tok = json.loads((work / "tokenizer.json").read_text(encoding="utf-8"))
    vocab: dict[str, int] = tok["model"]["vocab"]
    for added in tok["added_tokens"]:
        vocab[added["content"]] = added["id"]
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    assert [vocab[t] for t in tokens] == list(range(len(tokens))), "vocab ids must be dense"
    assert len(tokens) == cfg.vocab_size, (len(tokens), cfg.vocab_size)
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    specials = {a["id"] for a in tok["added_tokens"]}
    types = [
        gguf.TokenType.CONTROL if i in specials else gguf.TokenType.NORMAL
        for i in range(len(tokens))
    ]

    out.parent.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(str(out), "llama")
    w.add_name("rlx-lm default (Jane Austen)")
    w.add_context_length(cfg.ctx)
    w.add_embedding_length(cfg.dim)
    w.add_block_count(cfg.n_layers)
    w.add_feed_forward_length(cfg.ffn_dim)
    w.add_head_count(cfg.n_heads)
    w.add_head_count_kv(cfg.n_kv_heads)
    w.add_rope_freq_base(cfg.rope_theta)
    w.add_layer_norm_rms_eps(cfg.norm_eps)
    w.add_rope_dimension_count(cfg.head_dim)
    w.add_vocab_size(cfg.vocab_size)
    w.add_file_type(
        gguf.LlamaFileType.MOSTLY_Q8_0 if qtype == "q8_0" else gguf.LlamaFileType.MOSTLY_F16
    )
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(vocab[BOS])
    w.add_eos_token_id(vocab[EOS])
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)

    def matrix(name: str, a: np.ndarray) -> None:
        a = np.ascontiguousarray(a, dtype=np.float32)
        if qtype == "q8_0":
            q = gguf.quants.quantize(a, gguf.GGMLQuantizationType.Q8_0)
            w.add_tensor(name, q, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            w.add_tensor(name, a.astype(np.float16))

    def vector(name: str, a: np.ndarray) -> None:
        w.add_tensor(name, np.ascontiguousarray(a, dtype=np.float32))

    # numpy shape (rows=out, cols=in), as llama.cpp's converter writes HF Linear weights.
    matrix("token_embd.weight", flat["tok_emb"])
    for i in range(cfg.n_layers):
        p = f"layers.{i}."
        vector(f"blk.{i}.attn_norm.weight", flat[p + "attn_norm"])
        matrix(f"blk.{i}.attn_q.weight", flat[p + "wq"].T)
        matrix(f"blk.{i}.attn_k.weight", flat[p + "wk"].T)
        matrix(f"blk.{i}.attn_v.weight", flat[p + "wv"].T)
        matrix(f"blk.{i}.attn_output.weight", flat[p + "wo"].T)
        vector(f"blk.{i}.ffn_norm.weight", flat[p + "ffn_norm"])
        matrix(f"blk.{i}.ffn_gate.weight", flat[p + "w_gate"].T)
        matrix(f"blk.{i}.ffn_up.weight", flat[p + "w_up"].T)
        matrix(f"blk.{i}.ffn_down.weight", flat[p + "w_down"].T)
    vector("output_norm.weight", flat["out_norm"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"wrote {out} ({out.stat().st_size} bytes)")


# ----------------------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "stage", choices=["tokenizer", "train", "export", "card", "sample", "bench"]
    )
    parser.add_argument("--work", type=Path, default=ROOT / "build")
    parser.add_argument("--out", type=Path, default=ROOT / "python/rlx_lm/models/default.gguf")
    parser.add_argument("--budget-minutes", type=float, default=55.0)
    parser.add_argument("--log-every", type=int, default=25)
    parser.add_argument("--ckpt-every", type=int, default=250)
    parser.add_argument("--qtype", choices=["f16", "q8_0"], default="q8_0")
    parser.add_argument("--ckpt", choices=["best", "latest"], default="best")
    parser.add_argument("--steps", type=int)
    parser.add_argument("--seed", type=int)
    args = parser.parse_args()
    overrides = {k: getattr(args, k) for k in ("steps", "seed") if getattr(args, k) is not None}
    cfg = Config(**overrides)

    if args.stage == "tokenizer":
        train_tokenizer(args.work / "corpus", cfg.vocab_size, args.work / "tokenizer.json")
    elif args.stage == "train":
        print(f"config {asdict(cfg)}", flush=True)
        train(cfg, args.work, args.budget_minutes, args.log_every, args.ckpt_every)
    elif args.stage == "export":
        export_gguf(cfg, args.work, args.out, args.qtype, args.ckpt)
    elif args.stage == "card":
        write_card(cfg, args.work, args.out)
    elif args.stage == "sample":
        sys.path.insert(0, str(ROOT / "tools"))
        from numpy_llama import main as sample_main

        sample_main([str(args.out)])
    elif args.stage == "bench":
        bench(cfg)


CARD_PROMPTS = ("Once upon a time", "It is a truth universally acknowledged", "Mr. Darcy")


def write_card(cfg: Config, work: Path, out: Path) -> None:
    """MODEL_CARD.md beside the GGUF: provenance, figures, samples (numpy forward of the file)."""
    sys.path.insert(0, str(ROOT / "tools"))
    from numpy_llama import GgufLlama

    meta = json.loads((work / "train_meta.json").read_text())
    best = json.loads((work / "best_meta.json").read_text())
    source = (work / "corpus" / "SOURCE.txt").read_text().strip()
    model = GgufLlama(out)
    valid_ids, valid_starts = encode_corpus(work / "tokenizer.json", work / "corpus", "valid")
    vrng = np.random.default_rng(cfg.seed + 1)
    windows = np.concatenate(
        [make_batch(valid_ids, valid_starts, vrng, cfg.batch, cfg.ctx, 0) for _ in range(8)]
    )
    file_nll = model.mean_nll(windows)
    t0 = time.time()
    model.generate("Once upon a time", 100, 0.0, 0)
    gen_s = time.time() - t0
    samples = []
    for prompt in CARD_PROMPTS:
        for temp, top_p in ((0.0, 1.0), (0.8, 0.95)):
            text = model.generate(prompt, 60, temp, 7, top_p)
            label = "greedy" if temp == 0 else f"temperature {temp}, top-p {top_p}, seed 7"
            quoted = (prompt + text).replace("\n", "\n> ")
            samples.append(f"**{label}**\n\n> {quoted}\n")
    c = cfg
    size = out.stat().st_size
    seen = meta["step"] * c.batch * c.ctx
    epochs = seen / meta["train_tokens"]

    def loss(x: float) -> str:
        return f"{x:.3f} (perplexity {math.exp(x):.1f})"

    arch = [
        ("architecture", "llama: RMSNorm, RoPE, SwiGLU MLP, grouped-query attention, tied output"),
        ("layers / hidden / feed-forward", f"{c.n_layers} / {c.dim} / {c.ffn_dim}"),
        ("heads / kv heads / head dim", f"{c.n_heads} / {c.n_kv_heads} / {c.head_dim}"),
        ("context", f"{c.ctx} tokens; rope theta {c.rope_theta:g}, rms eps {c.norm_eps:g}"),
        ("vocabulary", f"{c.vocab_size}, byte-level BPE, GPT-2 pre-tokeniser"),
        ("special tokens", "`<s>` = 0 (BOS, prepended to prompts), `</s>` = 1 (EOS)"),
        ("parameters", f"{meta['n_params']:,}"),
        ("file", f"`default.gguf`, {size:,} bytes; matrices Q8_0, norms F32"),
    ]
    training = [
        ("seed", f"{c.seed}"),
        ("steps", f"{meta['step']} of {c.steps} planned, batch {c.batch} x {c.ctx} tokens"),
        ("tokens seen", f"{seen:,} ({epochs:.1f} epochs of {meta['train_tokens']:,})"),
        ("optimiser", f"AdamW (0.9, 0.95), weight decay {c.weight_decay:g}, clip {c.grad_clip:g}"),
        ("schedule", f"lr {c.lr:g}, {c.warmup} warm-up steps, cosine to {c.min_lr_frac:g}x"),
        ("wall time", f"{meta['wall_seconds'] / 60:.1f} min (1 CPU thread, nice 19, shared)"),
        ("final train loss", f"{loss(meta['train_loss'])}, mean of the last 25 steps"),
        ("final validation loss", loss(meta["valid_loss"])),
        ("shipped checkpoint", f"step {best['step']} (lowest validation loss)"),
        ("its validation loss", loss(best["valid_loss"])),
        ("same, Q8_0 file, numpy", loss(file_nll)),
        ("chance level", f"ln {c.vocab_size} = {math.log(c.vocab_size):.2f}"),
    ]

    def table(rows: list[tuple[str, str]]) -> str:
        return "\n".join(["| | |", "|---|---|", *(f"| {k} | {v} |" for k, v in rows)])

    text = "\n".join(
        [
            "# rlx-lm default model",
            "",
            "A tiny Llama-architecture model trained from scratch on Jane Austen's six novels,",
            "shipped in the wheel so `rlx-lm generate -p ...` and `rlx_lm.load_default()` work",
            "with no download. It writes Austen-flavoured English a clause or two at a time and",
            "knows nothing else: a demonstration and test fixture, not a useful language model.",
            "",
            "## Provenance",
            "",
            "```",
            source,
            "```",
            "",
            "The corpus is rebuilt by `tools/build_corpus.py` (the Debian package is fetched with",
            "`apt-get download`; headings, `_italic_` markers and line wrapping are removed, one",
            "paragraph per line); the last 4% of each novel's paragraphs are the validation split.",
            "Trained by `tools/train_default_model.py` (see `tools/README.md`): JAX on the CPU.",
            "",
            "## Architecture",
            "",
            table(arch),
            "",
            "RoPE rotates adjacent pairs (x[2i], x[2i+1]) of each head, the convention llama.cpp",
            'uses for architecture "llama". The model was trained that way, so its q/k rows are',
            "stored as trained, with no HF-to-GGUF row permutation.",
            "",
            "llama.cpp reads the file as written: through llama-cpp-python 0.3.36 it tokenises",
            "prompts to the same ids and its greedy continuations equal rlx-lm's and the numpy",
            "reference's (`tests/test_default_model.py` checks this when `llama_cpp` imports).",
            "",
            "## Training",
            "",
            table(training),
            "",
            f"Validation: {8 * c.batch} windows of {c.ctx} tokens (BOS, then a paragraph start)",
            f"from the held-out split ({meta['valid_tokens']:,} tokens in all).",
            "",
            "## Samples",
            "",
            "BOS + prompt, 60 new tokens, from `tools/numpy_llama.py` (an independent numpy",
            f"forward of the file; 100 greedy tokens took {gen_s:.2f} s there).",
            "",
            *samples,
        ]
    )
    (out.parent / "MODEL_CARD.md").write_text(text, encoding="utf-8")
    print(text)


def bench(cfg: Config) -> None:
    """Time a few training steps on random tokens (for sizing the model)."""
    import jax
    import jax.numpy as jnp

    cos_np, sin_np = rope_tables(cfg, cfg.ctx + 1)
    cos, sin = jnp.asarray(cos_np), jnp.asarray(sin_np)
    params = init_params(cfg, jax.random.PRNGKey(0))

    def loss_fn(p: Any, b: Any) -> Any:
        logits = forward(p, b[:, :-1], cfg, cos, sin)
        return jnp.mean(jax.nn.logsumexp(logits, -1))

    g = jax.jit(jax.value_and_grad(loss_fn))
    b = jnp.asarray(np.random.default_rng(0).integers(0, cfg.vocab_size, (cfg.batch, cfg.ctx + 1)))
    g(params, b)[0].block_until_ready()
    t = time.time()
    for _ in range(3):
        g(params, b)[0].block_until_ready()
    dt = (time.time() - t) / 3
    n = sum(int(np.prod(p.shape)) for p in jax.tree_util.tree_leaves(params))
    print(f"params {n} step {dt:.3f}s tokens/s {cfg.batch * cfg.ctx / dt:.0f}")


if __name__ == "__main__":
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    main()
