"""The CLI's sampler order: llama.cpp's --samplers list and a --sampler-order preset."""

from __future__ import annotations

import argparse

import pytest

from rlx_lm.cli import _parser, _sample_opts, _sampler_order


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
