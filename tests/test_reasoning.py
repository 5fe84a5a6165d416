"""Reasoning told apart from the answer (rlx_lm.reasoning): think tags and harmony channels,
whole and streamed in any pieces."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlx_lm.reasoning import Harmony, ThinkTags, reasoning_parser, split_reasoning

# Text that never forms a tag by itself: letters, spaces, newlines and lone markup characters.
plain = st.text(alphabet=st.sampled_from(list("ab <>|/\nthink")), max_size=40)


def _stream(parser: ThinkTags | Harmony, text: str, cuts: list[int]) -> tuple[str, str]:
    """``text`` fed in the pieces ``cuts`` gives, then finished."""
    at, reasoning, answer = 0, "", ""
    for c in [*sorted({min(c, len(text)) for c in cuts}), len(text)]:
        r, a = parser.feed(text[at:c])
        reasoning, answer, at = reasoning + r, answer + a, c
    r, a = parser.finish()
    return reasoning + r, answer + a


@settings(max_examples=300, deadline=None)
@given(
    reasoning=plain,
    answer=plain,
    lead=st.sampled_from(["", " ", "\n"]),
    cuts=st.lists(st.integers(0, 120), max_size=12),
)
def test_think_tags_split_the_same_however_the_text_is_cut(
    reasoning: str, answer: str, lead: str, cuts: list[int]
) -> None:
    text = f"{lead}<think>{reasoning}</think>\n\n{answer}"
    whole = split_reasoning(ThinkTags(), text)
    assert _stream(ThinkTags(), text, cuts) == whole
    # The reasoning up to the first close tag; the rest, white space trimmed, is the answer.
    first, _, rest = f"{reasoning}</think>\n\n{answer}".partition("</think>")
    assert whole == (first, rest.lstrip())


@settings(max_examples=200, deadline=None)
@given(text=plain, cuts=st.lists(st.integers(0, 60), max_size=8))
def test_a_reply_without_think_tags_is_all_answer_and_nothing_is_lost(
    text: str, cuts: list[int]
) -> None:
    if text.lstrip().startswith("<think>"):
        return
    got = _stream(ThinkTags(), text, cuts)
    assert got[0] == ""
    assert got[1] == (text.lstrip() if "<think>".startswith(text.lstrip()) else text)


def test_a_prompt_that_opens_the_reasoning_and_a_reply_that_never_closes_it() -> None:
    assert split_reasoning(ThinkTags(opened=True), "step 1\nstep 2</think> Paris") == (
        "step 1\nstep 2",
        "Paris",
    )
    assert split_reasoning(ThinkTags(), "<think>still thinking</thi") == ("still thinking</thi", "")
    assert split_reasoning(ThinkTags(), "Paris.") == ("", "Paris.")


HARMONY = "<|channel|>analysis<|message|>{r}<|start|>assistant<|channel|>final<|message|>{a}"


@settings(max_examples=300, deadline=None)
@given(reasoning=plain, answer=plain, cuts=st.lists(st.integers(0, 160), max_size=12))
def test_harmony_channels_split_the_same_however_the_text_is_cut(
    reasoning: str, answer: str, cuts: list[int]
) -> None:
    text = HARMONY.format(r=reasoning, a=answer)
    assert split_reasoning(Harmony(), text) == (reasoning, answer)
    assert _stream(Harmony(), text, cuts) == (reasoning, answer)


def test_harmony_commentary_and_headers_with_recipients() -> None:
    text = (
        "<|channel|>analysis<|message|>Need the tool."
        "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
        '<|message|>{"city": "Paris"}'
    )
    assert split_reasoning(Harmony(), text) == ("Need the tool.", '{"city": "Paris"}')
    # No markup at all (a model that ignores the format): all answer, held no longer than the
    # longest header.
    p = Harmony()
    assert p.feed("x" * 300) == ("", "x" * 300)
    assert split_reasoning(Harmony(), "plain answer") == ("", "plain answer")


def test_the_parser_follows_the_vocabulary_and_the_format() -> None:
    assert isinstance(reasoning_parser(["<|channel|>", "<|message|>", "<|return|>"]), Harmony)
    think = reasoning_parser(["<think>", "</think>"], "<|im_start|>assistant\n<think>\n")
    assert isinstance(think, ThinkTags)
    assert split_reasoning(think, "why</think>because") == ("why", "because")
    assert reasoning_parser(["<think>", "</think>"], fmt="none") is None
    assert reasoning_parser(["<|im_end|>"]) is None
    with pytest.raises(ValueError, match="reasoning format"):
        reasoning_parser([], fmt="deepseek-ish")
