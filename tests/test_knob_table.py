"""A knob or stage added to the core's tables reaches every reader of them.

The core describes each knob once (``KNOBS``, rust/sampling/knobs.rs) and each stage once
(``STAGES``, rust/sampling/stages.rs). `SampleOpts`, the CLI, the pickled state, the
hypothesis strategies, the fuzz harnesses and the server's request parsing read those
tables; these tests fail when a new entry does not reach one of them, so a stage cannot
be half-added (docs/samplers.md lists the files a new stage touches).
"""

from __future__ import annotations

import dataclasses
import math
import pickle
import random
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import test_fuzz_sampling as fuzz
from hypothesis import given, settings

from rlx_lm import InvalidOptionError, SampleOpts, _core
from rlx_lm.cli import _LLAMA_STAGES, _parser, _sample_opts, _samplers
from rlx_lm.server.protocol import (
    CHAT_FIELDS,
    COMPLETION_FIELDS,
    KNOB_FIELDS,
    SAMPLER_LETTERS,
    SAMPLER_NAMES,
    Limits,
    ProtocolError,
    parse_completion,
)
from rlx_lm.testing.strategies import KNOB_TABLE, knob_values, sample_opts, valid_options

KNOBS = {k["name"]: k for k in _core.SAMPLER_KNOBS}
DEFAULTS = dataclasses.asdict(SampleOpts())


def _set(opts: SampleOpts, name: str) -> bool:
    return bool(getattr(opts, name) != DEFAULTS[name])


def test_the_strategies_read_the_core_table() -> None:
    assert KNOB_TABLE is _core.SAMPLER_KNOBS


@pytest.mark.parametrize("stage", [s["name"] for s in _core.SAMPLER_STAGES])
def test_every_stage_knob_is_a_sample_opts_field(stage: str) -> None:
    (spec,) = [s for s in _core.SAMPLER_STAGES if s["name"] == stage]
    fields = {f.name for f in dataclasses.fields(SampleOpts)}
    assert spec["knobs"], stage
    for name in spec["knobs"]:
        assert name in KNOBS, (stage, name)
        assert name in fields, (stage, name)


@pytest.mark.parametrize("stage", [s["name"] for s in _core.SAMPLER_STAGES])
def test_every_stage_but_logit_bias_is_named_by_the_clis_samplers(stage: str) -> None:
    (spec,) = [s for s in _core.SAMPLER_STAGES if s["name"] == stage]
    if stage == "logit_bias":
        # llama.cpp runs it first, outside --samplers; so does the CLI.
        assert spec["llama_cpp_names"] == ()
        return
    assert spec["llama_cpp_names"], f"{stage}: no name in llama.cpp's --samplers"
    for alias in spec["llama_cpp_names"]:
        assert _LLAMA_STAGES[alias] == stage
        assert _samplers(alias) == [stage]


def _cli_value(knob: dict[str, Any]) -> tuple[str, float]:
    """A value for the knob's flag: three quarters up its probe range."""
    lo, hi = knob["probe"]
    x = lo + 0.75 * (hi - lo)
    if knob["kind"] == "float":
        x = float(np.float32(x))
        return repr(x), x
    return str(int(x)), int(x)


def _cli_opts(flags: list[str]) -> SampleOpts:
    """The CLI's options for ``flags``, adding the flag of any knob the core asks for
    with them (XTC's probability needs a threshold)."""
    flags = list(flags)
    for _ in range(len(KNOBS)):
        try:
            return _sample_opts(_parser().parse_args(["generate", "m.gguf", "-p", "x", *flags]))
        except InvalidOptionError as e:
            knob = KNOBS[str(e).split(":", 1)[0]]
            if not knob["flag"] or knob["flag"] in flags:
                raise
            flags += [knob["flag"], _cli_value(knob)[0]]
    raise AssertionError(flags)


@pytest.mark.parametrize("name", [k["name"] for k in _core.SAMPLER_KNOBS if k["flag"]])
def test_every_knob_with_a_flag_reaches_sample_opts_through_the_cli(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    knob = KNOBS[name]
    text, want = _cli_value(knob)
    assert want != DEFAULTS[name], name
    assert getattr(_cli_opts([knob["flag"], text]), name) == pytest.approx(want), name
    with pytest.raises(SystemExit):
        _parser().parse_args(["generate", "--help"])
    helps = " ".join(capsys.readouterr().out.split())
    assert knob["flag"] in helps, name
    assert " ".join(knob["help"].split()) in helps, name


def test_the_hypothesis_strategy_draws_every_knob() -> None:
    seen: set[str] = set()
    row = np.linspace(-1.0, 1.0, 16, dtype=np.float32)

    @settings(max_examples=200, database=None, deadline=None)
    @given(sample_opts(16))
    def draw(opts: SampleOpts) -> None:
        seen.update(n for n in KNOBS if _set(opts, n))
        # Whatever it draws, a chain takes, and its pickled state keeps.
        chain = opts.into_chain()
        again = pickle.loads(pickle.dumps(chain))
        assert again.peek(row, [1, 2, 3]) == chain.peek(row, [1, 2, 3])

    draw()
    assert seen == set(KNOBS), sorted(set(KNOBS) - seen)


def test_the_fuzz_harness_draws_every_knob_it_fuzzes() -> None:
    rng = random.Random(14)
    seen: set[str] = set()
    for _ in range(600):
        opts = fuzz.draw_opts(fuzz.RandomDraw(rng), 16)
        seen |= {n for n in KNOBS if _set(opts, n)}
    assert seen == set(KNOBS) - set(fuzz.KNOBS_OFF), sorted(set(KNOBS) - seen)


def test_a_knob_of_an_unknown_kind_is_refused_loudly() -> None:
    with pytest.raises(AssertionError, match="no strategy for its kind"):
        knob_values({**KNOBS["top_p"], "kind": "quaternion"}, 16)


def test_valid_options_resets_what_the_core_refuses() -> None:
    # dynamic_temp replaces temperature: the core names temperature, which goes back.
    o = valid_options({"temperature": 0.7, "dynamic_temp": (0.5, 1.5)})
    assert o.temperature == 0.0
    assert o.dynamic_temp == (0.5, 1.5)
    # An XTC threshold of 0 with XTC on: reset alone it stays refused, so XTC's knobs go.
    o = valid_options({"temperature": 1.0, "xtc_prob": 0.5, "xtc_threshold": 0.0})
    assert o.xtc_prob == 0.0
    assert o.temperature == 1.0
    # A min_keep no stage of some preset reads (llama.cpp's top-k does not).
    o = valid_options({"temperature": 1.0, "top_k": 5, "min_keep": 3})
    assert o.min_keep == 1
    assert o.top_k == 5
    # What every preset takes is left alone.
    kw = {"temperature": 1.0, "top_p": 0.5, "min_keep": 3, "logit_bias": {1: -math.inf}}
    assert valid_options(kw) == SampleOpts(**kw)


# ----------------------------------------------------------------- the server

LIMITS = Limits(model_name="m", vocab_size=64, max_tokens=8, max_n=2, max_top_logprobs=2)

# A body value of each knob kind, three quarters up its probe range where it has one;
# llama-server's own formats where the field is its own (dynatemp_range: a range
# around temperature).
_OWN_FORMAT: dict[str, Any] = {"dynatemp_range": 0.5}


def _body_value(knob: dict[str, Any]) -> Any:
    lo, hi = knob["probe"]
    x = lo + 0.75 * (hi - lo)
    kind = knob["kind"]
    if kind == "float":
        return float(np.float32(x))
    if kind in ("int", "int | None", "mode"):
        return int(x)
    if kind == "pair | None":
        return [lo, hi]
    if kind == "tokens":
        return [3, 5]
    if kind == "seed":
        return 7
    if kind == "bias":
        return {"3": -1.5}
    raise AssertionError(f"{knob['name']}: no body value for its kind {kind!r}")


def _served_opts(body: dict[str, Any]) -> SampleOpts:
    """The options the server parses from ``body`` (token ids only: no tokenizer needed),
    adding a knob the core asks for: the one it names (XTC's probability needs a
    threshold), or, when it refuses a knob given alone (``min_keep``), the knob that turns
    on a stage reading it."""
    body = dict(body)
    for _ in range(len(KNOBS)):
        try:
            return parse_completion({"prompt": [1, 2], **body}, None, LIMITS).requests[0].opts  # type: ignore[arg-type]
        except ProtocolError as e:
            knob = KNOB_FIELDS[e.param or ""]
            if e.param in body:
                knob = next(
                    s["knobs"][0]
                    for s in _core.SAMPLER_STAGES
                    if knob in s["knobs"] and s["knobs"][0] != knob
                )
            field = KNOBS[knob]["server_fields"][0]
            if field in body:
                raise
            body[field] = _OWN_FORMAT.get(field, _body_value(KNOBS[knob]))
    raise AssertionError(body)


def test_every_knob_has_server_fields_on_both_routes() -> None:
    for knob in _core.SAMPLER_KNOBS:
        assert knob["server_fields"], knob["name"]
        for field in knob["server_fields"]:
            assert KNOB_FIELDS[field] == knob["name"]
            assert field in CHAT_FIELDS
            assert field in COMPLETION_FIELDS


@pytest.mark.parametrize("field", [f for k in _core.SAMPLER_KNOBS for f in k["server_fields"]])
def test_every_knob_is_accepted_by_the_servers_request_parsing(field: str) -> None:
    name = KNOB_FIELDS[field]
    value = _OWN_FORMAT.get(field, _body_value(KNOBS[name]))
    opts = _served_opts({field: value})
    got = getattr(opts, name)
    assert got != DEFAULTS[name], (field, got)
    if KNOBS[name]["kind"] in ("float", "int", "int | None", "mode"):
        assert got == pytest.approx(value), field


@pytest.mark.parametrize("stage", [s["name"] for s in _core.SAMPLER_STAGES])
def test_every_stage_is_accepted_by_the_servers_samplers(stage: str) -> None:
    (spec,) = [s for s in _core.SAMPLER_STAGES if s["name"] == stage]
    # Temperature always runs (the server's default is 1.0); logit bias first unless listed.
    rest = () if stage == "temperature" else ("temperature",)
    want = (stage, *rest) if stage == "logit_bias" else ("logit_bias", stage, *rest)
    names = (stage, *spec["llama_cpp_names"])
    letter = spec["llama_cpp_letter"]
    if stage == "logit_bias":
        assert letter is None  # llama.cpp runs it first, outside its lists
    else:
        assert letter, f"{stage}: no llama.cpp letter"
    given: list[Any] = [[n, *rest] for n in names]
    if letter:
        given.append(letter + ("t" if rest else ""))
    for samplers in given:
        body = {"prompt": [1], "samplers": samplers}
        parsed = parse_completion(body, None, LIMITS)  # type: ignore[arg-type]
        assert parsed.requests[0].order == want, samplers
    assert all(SAMPLER_NAMES[n] == stage for n in names)
    if letter:
        assert SAMPLER_LETTERS[letter] == stage


def test_the_docs_count_of_files_a_new_stage_touches_is_its_tables() -> None:
    doc = (Path(__file__).parent.parent / "docs" / "samplers.md").read_text()
    table = doc[doc.index("Files a new stage touches") :]
    rows = [r for r in table[: table.index("\n\n", table.index("|"))].splitlines() if "|" in r]
    now = [r.strip("|").split("|")[-1].strip() for r in rows[2:]]
    m = re.search(r"Now \*\*(\d+) files\*\*", table)
    assert m is not None
    touched = [c for c in now if not (c.startswith("no") or c in ("-", "(not counted)"))]
    assert int(m.group(1)) == len(touched)


def test_the_servers_dry_breakers_are_llama_servers(tmp_path: Path) -> None:
    from model_factory import make_tiny, write_gguf
    from tokenizer_factory import bpe_gguf_fields, train_bpe

    from rlx_lm.sample_opts import DRY_DEFAULT_BREAKERS
    from rlx_lm.tokenizer import Tokenizer

    path = tmp_path / "m.gguf"
    write_gguf(make_tiny(vocab=300), path, tokenizer=bpe_gguf_fields(train_bpe()))
    tok = Tokenizer.load(path)
    limits = Limits(model_name="m", vocab_size=300, max_tokens=8, max_n=2, max_top_logprobs=2)

    def breakers(**body: Any) -> tuple[int, ...]:
        parsed = parse_completion({"prompt": "the cat", **body}, tok, limits)
        return parsed.requests[0].opts.dry_sequence_breakers

    # DRY on and no breakers given: llama-server's four, as every token holding one
    assert breakers(dry_multiplier=0.8) == tok.ids_containing(DRY_DEFAULT_BREAKERS)
    assert breakers(dry_multiplier=0.8, dry_sequence_breakers=[]) == ()
    assert breakers(dry_multiplier=0.8, dry_sequence_breakers=["at"]) == tok.ids_containing(["at"])
    assert breakers(dry_multiplier=0.8, dry_sequence_breakers=[7, "at"]) == (
        7,
        *tok.ids_containing(["at"]),
    )
    assert breakers() == ()  # DRY off
