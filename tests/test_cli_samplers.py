"""The CLI's sampler order (llama.cpp's --samplers list, a --sampler-order preset) and
llama.cpp's other sampling flags: --dynatemp-*, -l/--logit-bias, --dry-sequence-breaker,
--ignore-eos."""

from __future__ import annotations

import argparse
import math

import pytest
from model_factory import make_tiny, write_gguf
from tokenizer_factory import bpe_gguf_fields, train_bpe

from rlx_lm import InvalidOptionError, SampleOpts
from rlx_lm.cli import _parser, _sample_opts, _sampler_order, _with_tokenizer
from rlx_lm.sample_opts import DRY_DEFAULT_BREAKERS
from rlx_lm.tokenizer import Tokenizer


def parse(*flags: str) -> argparse.Namespace:
    return _parser().parse_args(["generate", "m.gguf", "-p", "x", *flags])


def test_the_default_order_is_llama_cpps_and_help_says_why(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert _sampler_order(parse()) == "llama.cpp"
    with pytest.raises(SystemExit):
        _parser().parse_args(["generate", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "--sampler-order" in out
    assert "Every sampling flag here is llama.cpp's, so the chain is llama.cpp's too" in out
    assert "(default: llama.cpp)" in out
    assert "--samplers" in out


@pytest.mark.parametrize("order", ["default", "llama.cpp", "hf", "vllm"])
def test_sampler_order_picks_a_preset(order: str) -> None:
    args = parse("--sampler-order", order, "--temp", "0.8", "--top-k", "40")
    assert _sampler_order(args) == order
    assert _sample_opts(args).into_chain(_sampler_order(args)).order == order


def test_samplers_takes_llama_cpps_names_and_aliases() -> None:
    args = parse("--samplers", "penalties;top_k;typ_p;top-p;min_p;temp", "--temp", "0.7")
    order = _sampler_order(args)
    assert order == ["logit_bias", "penalties", "top_k", "typical", "top_p", "min_p", "temperature"]
    opts = _sample_opts(parse("--temp", "0.7", "--top-k", "5", "--min-p", "0.1"))
    chain = opts.into_chain(order)
    assert chain.stages == ["top_k", "min_p", "temperature", "dist"]


def test_bad_sampler_lists_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse("--samplers", "top_k;nope")
    assert "unknown sampler 'nope'" in capsys.readouterr().err
    from rlx_lm.cli import main

    assert main(["generate", "-p", "x", "--samplers", "top_k", "--sampler-order", "hf"]) == 2
    assert "give one" in capsys.readouterr().err
    # A knob whose stage is left out of the list is an error, not silently dropped.
    assert main(["generate", "-p", "x", "--samplers", "top_k;temp", "--min-p", "0.1"]) == 2
    assert "min_p" in capsys.readouterr().err


# ---------------------------------------------------------------- llama.cpp's other flags


def test_dynatemp_range_is_a_range_around_temp() -> None:
    opts = _sample_opts(parse("--temp", "0.8", "--dynatemp-range", "0.5", "--dynatemp-exp", "1.5"))
    assert opts.dynamic_temp == pytest.approx((0.3, 1.3))
    assert opts.temperature == 0.0  # the pair replaces it
    assert opts.dynamic_temp_exponent == 1.5
    assert _sample_opts(parse("--dynatemp-range", "0.5")).dynamic_temp == pytest.approx((0, 0.5))
    assert _sample_opts(parse("--temp", "0.2", "--dynatemp-range", "1")).dynamic_temp == (0, 1.2)
    off = _sample_opts(parse("--temp", "0.7", "--dynatemp-range", "0"))
    assert (off.dynamic_temp, off.temperature) == (None, 0.7)
    with pytest.raises(InvalidOptionError, match="--dynatemp-range must be >= 0"):
        _sample_opts(parse("--dynatemp-range", "-1"))
    with pytest.raises(InvalidOptionError, match="--dynatemp-range must be >= 0"):
        _sample_opts(parse("--dynatemp-range", "nan"))


def test_logit_bias_reads_llama_cpps_token_sign_bias() -> None:
    opts = _sample_opts(parse("-l", "15+1", "--logit-bias", "7-inf", "-l", "9-0.5", "-l", "15+2"))
    assert dict(opts.logit_bias) == {15: 2.0, 7: -math.inf, 9: -0.5}  # the last 15 counts


@pytest.mark.parametrize(
    "bad", ["abc", "15", "15+", "+5", "15++1", "15+-1", "-3+1", "15+x", "1+nan"]
)
def test_a_malformed_logit_bias_is_a_usage_error(
    bad: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        parse("-l", bad)
    assert "TOKEN_ID" in capsys.readouterr().err


@pytest.fixture(scope="module")
def tok(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    path = tmp_path_factory.mktemp("bpe") / "m.gguf"
    write_gguf(make_tiny(vocab=300), path, tokenizer=bpe_gguf_fields(train_bpe()))
    return Tokenizer.load(path)


def _opts(tok: Tokenizer, *flags: str) -> SampleOpts:
    args = parse(*flags)
    return _with_tokenizer(_sample_opts(args), args, tok)


def test_dry_takes_llama_cpps_default_breakers(tok: Tokenizer) -> None:
    assert _opts(tok).dry_sequence_breakers == ()  # DRY off: nothing to break
    on = _opts(tok, "--dry-multiplier", "0.8")
    assert on.dry_sequence_breakers == tok.ids_containing(DRY_DEFAULT_BREAKERS)
    assert set(tok.encode("\n", add_special_tokens=False)) <= set(on.dry_sequence_breakers)


def test_dry_sequence_breaker_replaces_the_defaults_and_none_clears(tok: Tokenizer) -> None:
    def breakers(*given: str) -> tuple[int, ...]:
        flags = [f for b in given for f in ("--dry-sequence-breaker", b)]
        return _opts(tok, "--dry-multiplier", "0.8", *flags).dry_sequence_breakers

    assert breakers("at") == tok.ids_containing(["at"])
    assert set(breakers("at")).isdisjoint(tok.encode("\n", add_special_tokens=False))
    assert breakers("at", "!") == tok.ids_containing(["at", "!"])
    assert breakers("none") == ()
    assert breakers("at", "none", "!") == tok.ids_containing(["!"])


def test_ignore_eos_bans_every_end_of_generation_token(tok: Tokenizer) -> None:
    assert tok.stop_token_ids
    opts = _opts(tok, "--ignore-eos", "-l", "5+1")
    assert {t: opts.logit_bias[t] for t in tok.stop_token_ids} == {
        t: -math.inf for t in tok.stop_token_ids
    }
    assert opts.logit_bias[5] == 1.0
    assert not any(v == -math.inf for v in _opts(tok, "-l", "5+1").logit_bias.values())


def test_a_logit_bias_token_outside_the_vocabulary_is_refused(tok: Tokenizer) -> None:
    with pytest.raises(InvalidOptionError, match="token 300 is not in the vocabulary"):
        _opts(tok, "-l", "300+1")


def test_ignore_eos_generates_past_the_end_of_text(capsys: pytest.CaptureFixture[str]) -> None:
    from rlx_lm.cli import main
    from rlx_lm.default_model import default_model_path

    eos = min(Tokenizer.load(default_model_path()).stop_token_ids)
    # EOS pushed to the top: greedy ends at once, unless EOS is ignored
    base = ["generate", "-p", "It is", "-n", "6", "-t", "1", "-l", f"{eos}+100"]
    assert main(base) == 0
    assert "decode: 0 tokens" in capsys.readouterr().err
    assert main([*base, "--ignore-eos"]) == 0
    err = capsys.readouterr().err
    assert "decode: 6 tokens" in err
    assert "stop: length" in err


def test_verbose_shows_a_long_breaker_list_as_its_length() -> None:
    from rlx_lm.cli import _shown

    many = SampleOpts(dry_multiplier=0.8, dry_sequence_breakers=tuple(range(40)))
    assert "dry_sequence_breakers=<40 ids>" in _shown(many)
    few = SampleOpts(dry_multiplier=0.8, dry_sequence_breakers=(3, 4))
    assert _shown(few) == repr(few)
