"""The default model shipped in the wheel: file format, quality, and loading through the runner.

The plain numpy reference below reads the GGUF weights as llama.cpp does (RoPE on adjacent pairs
(x[2i], x[2i+1]) for architecture "llama") and shares no code with ``rlx_lm.runners``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

MODEL = Path(__file__).resolve().parent.parent / "python" / "rlx_lm" / "models" / "default.gguf"
DATA = Path(__file__).resolve().parent / "data"
WORD = re.compile(r"[a-z]+(?:'[a-z]+)*")
PROMPTS = (
    "Once upon a time",
    "It is a truth universally acknowledged",
    "She walked into the room and",
    "My dear Mr. Bennet,",
)
# Held-out text: two paragraphs of the validation split (the end of "Persuasion"), not trained on.
HELD_OUT = (DATA / "default_model_held_out.txt").read_text(encoding="utf-8").splitlines()


def model_path() -> Path:
    """The shipped file: the installed package's copy when rlx_lm is importable, else the tree's."""
    try:
        import rlx_lm

        installed = Path(rlx_lm.__file__).parent / "models" / "default.gguf"
        if installed.exists():
            return installed
    except ImportError:
        pass
    return MODEL


# ------------------------------------------------------------------ plain numpy reference


def _field(reader: Any, name: str) -> Any:
    f = reader.fields[name]
    if f.types[0] == gguf.GGUFValueType.ARRAY:
        if f.types[-1] == gguf.GGUFValueType.STRING:
            return [bytes(f.parts[i]).decode() for i in f.data]
        return [f.parts[i][0].item() for i in f.data]
    if f.types[0] == gguf.GGUFValueType.STRING:
        return bytes(f.parts[f.data[0]]).decode()
    return f.parts[f.data[0]][0].item()


class Reference:
    """Float64 whole-sequence forward of a llama GGUF, from the architecture's definition."""

    def __init__(self, path: Path) -> None:
        self.reader = gguf.GGUFReader(str(path))
        r = self.reader
        self.meta = {k: _field(r, k) for k in r.fields if not k.startswith("GGUF.")}
        self.w: dict[str, np.ndarray] = {}
        for t in r.tensors:
            a = gguf.quants.dequantize(t.data, t.tensor_type)
            self.w[t.name] = np.asarray(a, np.float64).reshape([int(x) for x in t.shape[::-1]])
        m = self.meta
        self.n_layers = int(m["llama.block_count"])
        self.nh = int(m["llama.attention.head_count"])
        self.nkv = int(m["llama.attention.head_count_kv"])
        self.hd = int(m["llama.embedding_length"]) // self.nh
        self.eps = float(m["llama.attention.layer_norm_rms_epsilon"])
        self.theta = float(m["llama.rope.freq_base"])

    def tokenizer(self) -> Any:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers

        toks = self.meta["tokenizer.ggml.tokens"]
        merges = [tuple(x.split(" ", 1)) for x in self.meta["tokenizer.ggml.merges"]]
        tok = Tokenizer(models.BPE({t: i for i, t in enumerate(toks)}, merges))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        tok.decoder = decoders.ByteLevel()
        return tok

    def logits(self, ids: list[int], w: dict[str, np.ndarray] | None = None) -> np.ndarray:
        w = self.w if w is None else w
        n, hd = len(ids), self.hd

        def rms(x: np.ndarray, g: np.ndarray) -> np.ndarray:
            return x / np.sqrt((x * x).mean(-1, keepdims=True) + self.eps) * g

        ang = np.outer(np.arange(n), self.theta ** (-np.arange(0, hd, 2) / hd))
        cos, sin = np.cos(ang)[None], np.sin(ang)[None]

        def rope(x: np.ndarray) -> np.ndarray:  # x: [heads, n, hd]
            a, b = x[..., 0::2], x[..., 1::2]
            out = np.empty_like(x)
            out[..., 0::2] = a * cos - b * sin
            out[..., 1::2] = a * sin + b * cos
            return out

        x = w["token_embd.weight"][ids]
        mask = np.triu(np.full((n, n), -np.inf), k=1)
        for i in range(self.n_layers):
            p = f"blk.{i}."
            h = rms(x, w[p + "attn_norm.weight"])
            q = (h @ w[p + "attn_q.weight"].T).reshape(n, self.nh, hd).transpose(1, 0, 2)
            k = (h @ w[p + "attn_k.weight"].T).reshape(n, self.nkv, hd).transpose(1, 0, 2)
            v = (h @ w[p + "attn_v.weight"].T).reshape(n, self.nkv, hd).transpose(1, 0, 2)
            q, k = rope(q), rope(k)
            k = np.repeat(k, self.nh // self.nkv, axis=0)
            v = np.repeat(v, self.nh // self.nkv, axis=0)
            s = q @ k.transpose(0, 2, 1) / np.sqrt(hd) + mask
            s = np.exp(s - s.max(-1, keepdims=True))
            s /= s.sum(-1, keepdims=True)
            x = x + (s @ v).transpose(1, 0, 2).reshape(n, -1) @ w[p + "attn_output.weight"].T
            h = rms(x, w[p + "ffn_norm.weight"])
            g = h @ w[p + "ffn_gate.weight"].T
            x = (
                x
                + (g / (1 + np.exp(-g)) * (h @ w[p + "ffn_up.weight"].T))
                @ w[p + "ffn_down.weight"].T
            )
        x = rms(x, w["output_norm.weight"])
        return np.asarray(x @ w.get("output.weight", w["token_embd.weight"]).T)

    def greedy(self, ids: list[int], n: int, w: dict[str, np.ndarray] | None = None) -> list[int]:
        out = list(ids)
        for _ in range(n):
            out.append(int(np.argmax(self.logits(out, w)[-1])))
        return out[len(ids) :]

    def mean_nll(self, ids: list[int], w: dict[str, np.ndarray] | None = None) -> float:
        z = self.logits(ids[:-1], w)
        z = z - z.max(-1, keepdims=True)
        logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
        return float(-logp[np.arange(len(ids) - 1), ids[1:]].mean())

    def held_out_nll(self, w: dict[str, np.ndarray] | None = None) -> float:
        """Mean NLL over the held-out paragraphs (BOS + their first 200 tokens each)."""
        tok, bos = self.tokenizer(), int(self.meta["tokenizer.ggml.bos_token_id"])
        rows = [[bos, *tok.encode(p).ids[:200]] for p in HELD_OUT]
        return float(np.mean([self.mean_nll(r, w) for r in rows]))


@pytest.fixture(scope="module")
def ref() -> Reference:
    return Reference(model_path())


@pytest.fixture(scope="module")
def training_words() -> frozenset[str]:
    return frozenset((DATA / "default_model_words.txt").read_text(encoding="utf-8").split())


def word_share(text: str, words: frozenset[str]) -> tuple[float, int]:
    """Share of ``text``'s words found in ``words``, and how many distinct words it has."""
    found = WORD.findall(text.lower())
    if not found:
        return 0.0, 0
    return sum(w in words for w in found) / len(found), len(set(found))


def reads_as_training_english(text: str, words: frozenset[str]) -> bool:
    """Mostly (>= 85%) words of the training text, and not one word repeated."""
    share, distinct = word_share(text, words)
    return share >= 0.85 and distinct >= 5


def random_weights(ref: Reference, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        k: (np.ones_like(v) if v.ndim == 1 else rng.normal(0.0, 0.02, v.shape))
        for k, v in ref.w.items()
    }


# ------------------------------------------------------------------ the file


def test_file_is_small_enough_for_the_wheel() -> None:
    assert model_path().stat().st_size < 8 * 1024 * 1024


def test_metadata_is_llama_cpp_style(ref: Reference) -> None:
    m = ref.meta
    assert m["general.architecture"] == "llama"
    dim = m["llama.embedding_length"]
    assert ref.w["token_embd.weight"].shape == (m["llama.vocab_size"], dim)
    for key in (
        "llama.context_length",
        "llama.block_count",
        "llama.feed_forward_length",
        "llama.attention.head_count",
        "llama.attention.head_count_kv",
        "llama.rope.freq_base",
        "llama.attention.layer_norm_rms_epsilon",
    ):
        assert m[key] > 0, key
    assert m["llama.context_length"] >= 256
    assert m["tokenizer.ggml.model"] == "gpt2"
    assert m["tokenizer.ggml.pre"] == "gpt-2"
    tokens = m["tokenizer.ggml.tokens"]
    assert len(tokens) == m["llama.vocab_size"] == len(m["tokenizer.ggml.token_type"])
    bos, eos = m["tokenizer.ggml.bos_token_id"], m["tokenizer.ggml.eos_token_id"]
    assert (tokens[bos], tokens[eos]) == ("<s>", "</s>")
    control = int(gguf.TokenType.CONTROL)
    assert m["tokenizer.ggml.token_type"][bos] == m["tokenizer.ggml.token_type"][eos] == control
    assert m["tokenizer.ggml.add_bos_token"] is True
    assert len(m["tokenizer.ggml.merges"]) > 1000


def test_tensors_are_named_and_typed_as_llama_cpp_writes_them(ref: Reference) -> None:
    m = ref.meta
    n_layers, dim = m["llama.block_count"], m["llama.embedding_length"]
    ffn = m["llama.feed_forward_length"]
    kv_dim = dim // m["llama.attention.head_count"] * m["llama.attention.head_count_kv"]
    expected = {"token_embd.weight": (m["llama.vocab_size"], dim), "output_norm.weight": (dim,)}
    for i in range(n_layers):
        b = f"blk.{i}."
        expected |= {
            b + "attn_norm.weight": (dim,),
            b + "attn_q.weight": (dim, dim),
            b + "attn_k.weight": (kv_dim, dim),
            b + "attn_v.weight": (kv_dim, dim),
            b + "attn_output.weight": (dim, dim),
            b + "ffn_norm.weight": (dim,),
            b + "ffn_gate.weight": (ffn, dim),
            b + "ffn_up.weight": (ffn, dim),
            b + "ffn_down.weight": (dim, ffn),
        }
    assert {k: v.shape for k, v in ref.w.items()} == expected  # tied output: no output.weight
    types = {t.name: t.tensor_type for t in ref.reader.tensors}
    for name, ty in types.items():
        want = gguf.GGMLQuantizationType.F32 if name.endswith("norm.weight") else None
        if want is not None:
            assert ty == want, name
        else:
            assert ty == gguf.GGMLQuantizationType.Q8_0, name
    assert all(np.isfinite(v).all() for v in ref.w.values())


# ------------------------------------------------------------------ quality (reference forward)


def test_held_out_text_is_predicted_far_better_than_chance(ref: Reference) -> None:
    nll = ref.held_out_nll()
    chance = float(np.log(ref.meta["llama.vocab_size"]))
    assert nll < 0.6 * chance, (nll, chance)
    assert ref.held_out_nll(random_weights(ref, 0)) > 0.95 * chance


def test_rope_convention_is_adjacent_pairs_with_unpermuted_qk(ref: Reference) -> None:
    """The model was trained with adjacent-pair RoPE, so its q/k rows are stored as trained.

    Had the exporter applied convert_hf_to_gguf.py's HF -> GGUF row permutation on top (right
    only for rotate-half training), llama.cpp would pair the wrong dimensions: that must hurt.
    """

    def permute(w: np.ndarray, heads: int) -> np.ndarray:
        rows, cols = w.shape
        return w.reshape(heads, 2, rows // heads // 2, cols).swapaxes(1, 2).reshape(rows, cols)

    permuted = dict(ref.w)
    for i in range(ref.n_layers):
        permuted[f"blk.{i}.attn_q.weight"] = permute(ref.w[f"blk.{i}.attn_q.weight"], ref.nh)
        permuted[f"blk.{i}.attn_k.weight"] = permute(ref.w[f"blk.{i}.attn_k.weight"], ref.nkv)
    assert ref.held_out_nll() < ref.held_out_nll(permuted) - 0.1


def test_greedy_continuations_are_training_english(
    ref: Reference, training_words: frozenset[str]
) -> None:
    tok = ref.tokenizer()
    bos = ref.meta["tokenizer.ggml.bos_token_id"]
    texts = [tok.decode(ref.greedy([bos, *tok.encode(p).ids], 24)) for p in PROMPTS]
    assert all(reads_as_training_english(t, training_words) for t in texts), texts


def test_the_english_check_fails_for_random_weights(
    ref: Reference, training_words: frozenset[str]
) -> None:
    tok = ref.tokenizer()
    bos = ref.meta["tokenizer.ggml.bos_token_id"]
    for seed in range(2):
        w = random_weights(ref, seed)
        texts = [tok.decode(ref.greedy([bos, *tok.encode(p).ids], 24, w)) for p in PROMPTS[:2]]
        assert not all(reads_as_training_english(t, training_words) for t in texts), texts


# ------------------------------------------------------------------ through the runner


@pytest.fixture(scope="module")
def loaded() -> tuple[Any, Any]:
    import rlx_lm

    return rlx_lm.load_default()


def test_load_default_returns_a_ready_runner_and_tokenizer(loaded: tuple[Any, Any]) -> None:
    from rlx_lm.default_model import DEFAULT_CONTEXT, default_model_path
    from rlx_lm.runners.llama import LlamaRunner
    from rlx_lm.tokenizer import Tokenizer

    runner, tok = loaded
    assert isinstance(runner, LlamaRunner)
    assert isinstance(tok, Tokenizer)
    assert default_model_path().is_file()
    assert runner.vocab_size == tok.vocab_size == 4096
    assert runner.max_seq == DEFAULT_CONTEXT
    ids = tok.encode("Once upon a time")
    assert ids[0] == tok.bos_id == 0
    assert tok.decode(ids) == "Once upon a time"
    assert tok.is_eos(1)


def test_runner_logits_match_the_reference_on_the_shipped_model(
    ref: Reference, loaded: tuple[Any, Any]
) -> None:
    runner, tok = loaded
    ids = tok.encode("It is a truth universally acknowledged, that a single man")
    want = ref.logits(ids)[-1]
    got = np.asarray(runner.predict_logits(ids), np.float64)
    np.testing.assert_allclose(got, want, atol=2e-3 * np.abs(want).max())
    assert int(np.argmax(got)) == int(np.argmax(want))


def test_runner_greedy_continuations_are_training_english(
    loaded: tuple[Any, Any], training_words: frozenset[str]
) -> None:
    runner, tok = loaded
    texts = [tok.decode(runner.generate(tok.encode(p), 32)) for p in PROMPTS]
    shares = [word_share(t, training_words) for t in texts]
    assert all(reads_as_training_english(t, training_words) for t in texts), (texts, shares)


def test_generate_with_the_default_model_streams_text(loaded: tuple[Any, Any]) -> None:
    from rlx_lm.generation import generate

    runner, tok = loaded
    r = generate(runner, tok, "Once upon a time", max_tokens=20, seed=3)
    assert 0 < len(r.tokens) <= 20
    assert WORD.search(r.text.lower())


def test_cli_generate_without_a_model_uses_the_bundled_one(
    capsys: pytest.CaptureFixture[str], training_words: frozenset[str]
) -> None:
    from rlx_lm.cli import main

    assert main(["generate", "-p", "It is a truth universally acknowledged", "-n", "24"]) == 0
    out, err = capsys.readouterr()
    assert reads_as_training_english(out, training_words), out
    assert "decode:" in err


def test_llama_cpp_reads_the_file_as_we_do(ref: Reference) -> None:
    """Optional: llama.cpp tokenises alike, and agrees on logits and greedy text."""
    llama_cpp = pytest.importorskip("llama_cpp")
    llm = llama_cpp.Llama(
        model_path=str(model_path()), n_ctx=256, logits_all=True, verbose=False, n_threads=1
    )
    prompt = "It is a truth universally acknowledged, that a single man"
    ids = [int(t) for t in llm.tokenize(prompt.encode(), add_bos=True)]
    assert ids == [ref.meta["tokenizer.ggml.bos_token_id"], *ref.tokenizer().encode(prompt).ids]
    llm.eval(ids)
    theirs = np.asarray(llm.scores[len(ids) - 1], np.float64)
    want = ref.logits(ids)[-1]
    # llama.cpp multiplies Q8_0 weights by 8-bit-quantised activations: about 0.5% of the range.
    np.testing.assert_allclose(theirs, want, atol=0.02 * np.abs(want).max())
    llm.reset()
    out = llm("Mr. Darcy", max_tokens=16, temperature=0.0)["choices"][0]["text"]
    tok = ref.tokenizer()
    bos = ref.meta["tokenizer.ggml.bos_token_id"]
    assert out == tok.decode(ref.greedy([bos, *tok.encode("Mr. Darcy").ids], 16))
