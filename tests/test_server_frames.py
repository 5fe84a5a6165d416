"""The streamed chunk's fast rendering gives the same bytes as rendering the whole chunk."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from rlx_lm.server.app import _Frames
from rlx_lm.server.protocol import ParsedRequest


@given(
    kind=st.sampled_from(["chat", "completion"]),
    usage=st.booleans(),
    model=st.text(min_size=1, max_size=12),
    index=st.integers(0, 64),
    text=st.text(max_size=40),
)
def test_a_text_frame_is_the_whole_frame_rendered(
    kind: str, usage: bool, model: str, index: int, text: str
) -> None:
    frames = _Frames(kind, ParsedRequest([], stream=True, include_usage=usage, model=model))
    if kind == "chat":
        choice = {"index": index, "delta": {"content": text}}
    else:
        choice = {"index": index, "text": text}
    choice |= {"logprobs": None, "finish_reason": None}
    want = frames.frame([choice])
    got = frames.text(index, text)
    assert got == want
    assert got.startswith("data: {")
    assert got.endswith("}\n\n")
    body = json.loads(got[6:])
    assert body["choices"][0]["index"] == index
    assert body["model"] == model
    assert ("usage" in body) is usage
