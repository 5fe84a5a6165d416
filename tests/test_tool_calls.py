"""Tool calls read out of replies (rlx_lm.tool_calls): each family's format as its authors
document it, whole and streamed in any pieces; a call that does not parse stays text; the
format picked from the template; calls sent back rendered by the template. Through the
server with the openai client: tests/test_server.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlx_lm.server import protocol as proto
from rlx_lm.tokenizer import Tokenizer
from rlx_lm.tool_calls import (
    HarmonyCalls,
    Hermes,
    Llama3Json,
    MistralCalls,
    ToolCall,
    ToolCallParser,
    split_tool_calls,
    tool_call_format,
    tool_call_parser,
)

TEMPLATES = Path(__file__).parent / "data" / "chat_templates"


def _stream(parser: ToolCallParser, text: str, cuts: list[int]) -> tuple[str, list[ToolCall]]:
    """``text`` fed in the pieces ``cuts`` gives, then finished."""
    at, out, calls = 0, "", []
    for c in [*sorted({min(c, len(text)) for c in cuts}), len(text)]:
        t, got = parser.feed(text[at:c])
        out, at = out + t, c
        calls += got
    t, got = parser.finish()
    return out + t, calls + got


def _named(calls: list[ToolCall]) -> list[tuple[str, Any]]:
    return [(c.name, json.loads(c.arguments)) for c in calls]


# --- each format, as documented ----------------------------------------------------------


def test_hermes_calls_as_qwen_documents_them() -> None:
    # Qwen's function-calling guide (Qwen2.5 with its own template): two calls in one turn.
    text = (
        '<tool_call>\n{"name": "get_current_temperature", "arguments": {"location": '
        '"San Francisco, CA, USA"}}\n</tool_call>\n<tool_call>\n{"name": '
        '"get_temperature_date", "arguments": {"location": "San Francisco, CA, USA", '
        '"date": "2024-10-01"}}\n</tool_call>'
    )
    content, calls = split_tool_calls(Hermes(), text)
    assert content.strip() == ""
    assert _named(calls) == [
        ("get_current_temperature", {"location": "San Francisco, CA, USA"}),
        ("get_temperature_date", {"location": "San Francisco, CA, USA", "date": "2024-10-01"}),
    ]
    assert all(c.id.startswith("call_") for c in calls)
    assert calls[0].id != calls[1].id
    # Text around calls is content; arguments given as JSON text are kept as they are.
    content, calls = split_tool_calls(
        Hermes(), 'Let me check.<tool_call>{"name": "f", "arguments": "{\\"a\\": 1}"}</tool_call>'
    )
    assert (content, [(c.name, c.arguments) for c in calls]) == (
        "Let me check.",
        [("f", '{"a": 1}')],
    )


def test_mistral_calls_in_both_of_its_shapes() -> None:
    # Mistral 7B v0.3 / Nemo: a JSON list after [TOOL_CALLS], ids given by the model.
    content, calls = split_tool_calls(
        MistralCalls(),
        '[TOOL_CALLS] [{"name": "get_current_weather", "arguments": {"location": "Paris", '
        '"format": "celsius"}, "id": "abcDEF123"}]',
    )
    assert content == ""
    assert _named(calls) == [("get_current_weather", {"location": "Paris", "format": "celsius"})]
    assert calls[0].id == "abcDEF123"
    # Later tokenizers: [TOOL_CALLS]name[ARGS]{...} a call.
    content, calls = split_tool_calls(
        MistralCalls(), 'On it.[TOOL_CALLS]get_weather[ARGS]{"city": "Oslo"}[TOOL_CALLS]now[ARGS]{}'
    )
    assert (content, _named(calls)) == ("On it.", [("get_weather", {"city": "Oslo"}), ("now", {})])


def test_llama3_json_calls() -> None:
    # Llama 3.1's model card: the reply is the JSON object, "parameters" for the arguments.
    content, calls = split_tool_calls(
        Llama3Json(), ' {"name": "get_current_conditions", "parameters": {"location": "Tokyo"}}'
    )
    assert (content, _named(calls)) == (
        "",
        [("get_current_conditions", {"location": "Tokyo"})],
    )
    content, calls = split_tool_calls(
        Llama3Json(), '{"name": "a", "parameters": {}}; {"name": "b", "arguments": {"x": 2}}'
    )
    assert _named(calls) == [("a", {}), ("b", {"x": 2})]
    # A reply that is not a call at all streams through untouched.
    assert split_tool_calls(Llama3Json(), "Tokyo is sunny. {x}") == ("Tokyo is sunny. {x}", [])


def test_harmony_calls_as_openai_documents_them() -> None:
    # OpenAI's harmony guide, as decoded text (<|end|> and the turn's <|call|> are not text).
    text = (
        "<|channel|>analysis<|message|>Need to use function get_weather."
        "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
        '<|message|>{"location":"San Francisco"}'
    )
    content, calls = split_tool_calls(HarmonyCalls(), text)
    assert content == "<|channel|>analysis<|message|>Need to use function get_weather."
    assert _named(calls) == [("get_weather", {"location": "San Francisco"})]
    # The recipient in the role part (gpt-oss's template writes calls back this way), and a
    # message after the call passed on whole.
    text = (
        "<|channel|>analysis<|message|>x<|start|>assistant to=functions.lookup<|channel|>"
        'commentary json<|message|>{"q": 1}<|start|>assistant<|channel|>final<|message|>done'
    )
    content, calls = split_tool_calls(HarmonyCalls(), text)
    assert content == (
        "<|channel|>analysis<|message|>x<|start|>assistant<|channel|>final<|message|>done"
    )
    assert _named(calls) == [("lookup", {"q": 1})]


@pytest.mark.parametrize(
    ("parser", "text"),
    [
        (Hermes, "a <tool_call>{not json}</tool_call> b"),
        (Hermes, 'a <tool_call>{"arguments": {}}</tool_call>'),  # no name
        (Hermes, "<tool_call>{} {}</tool_call>"),
        (Hermes, "an unclosed <tool_call>{"),
        (MistralCalls, "[TOOL_CALLS] [{broken"),
        (MistralCalls, '[TOOL_CALLS] [{"name": "f", "arguments": 3}]'),
        (Llama3Json, '{"name": "f", "parameters": {}} trailing'),
        (Llama3Json, '{"nom": "f"}'),
    ],
)
def test_a_call_that_does_not_parse_is_text(parser: type[ToolCallParser], text: str) -> None:
    assert split_tool_calls(parser(), text) == (text, [])


# --- any cutting ------------------------------------------------------------------------

plain = st.text(alphabet=st.sampled_from(list('ab {}<>|[]/\n"')), max_size=30)
names = st.sampled_from(["f", "get_weather", "x1"])
args = st.dictionaries(
    st.sampled_from(["a", "city"]), st.integers(-5, 5) | st.text("xy", max_size=3)
)


def _hermes(parts: list[tuple[str, str, dict[str, Any]]]) -> str:
    return "".join(
        f"{t}<tool_call>\n{json.dumps({'name': n, 'arguments': a})}\n</tool_call>"
        for t, n, a in parts
    )


def _harmony(parts: list[tuple[str, str, dict[str, Any]]]) -> str:
    out = []
    for k, (t, n, a) in enumerate(parts):
        lead = "" if k == 0 else "<|start|>assistant"
        out.append(f"{lead}<|channel|>analysis<|message|>{t}")
        out.append(f"<|start|>assistant<|channel|>commentary to=functions.{n} <|constrain|>json")
        out.append(f"<|message|>{json.dumps(a)}")
    return "".join(out)


@settings(max_examples=300, deadline=None)
@given(
    parts=st.lists(st.tuples(plain, names, args), max_size=3),
    tail=plain,
    fmt=st.sampled_from(["hermes", "harmony", "mistral", "llama3"]),
    cuts=st.lists(st.integers(0, 400), max_size=14),
)
def test_every_format_parses_the_same_however_the_text_is_cut(
    parts: list[tuple[str, str, dict[str, Any]]], tail: str, fmt: str, cuts: list[int]
) -> None:
    if fmt == "hermes":
        text = _hermes(parts) + tail
    elif fmt == "harmony":
        text = _harmony(parts)
    elif fmt == "mistral":
        calls_json = json.dumps([{"name": n, "arguments": a} for _, n, a in parts])
        text = tail + ("[TOOL_CALLS]" + calls_json if parts else "")
    else:
        text = "; ".join(json.dumps({"name": n, "parameters": a}) for _, n, a in parts) or tail
    whole = split_tool_calls(tool_call_parser(fmt), text)
    got = _stream(tool_call_parser(fmt), text, cuts)
    assert (got[0], _named(got[1])) == (whole[0], _named(whole[1]))
    # The calls written are the calls read, in order.
    if fmt != "llama3" or parts:
        assert _named(whole[1]) == [(n, a) for _, n, a in parts]


@settings(max_examples=200, deadline=None)
@given(text=plain, cuts=st.lists(st.integers(0, 60), max_size=8))
def test_text_without_calls_comes_through_whole(text: str, cuts: list[int]) -> None:
    for fmt in ("hermes", "mistral", "llama3"):
        if fmt == "llama3" and json_values_only(text):
            continue
        assert _stream(tool_call_parser(fmt), text, cuts) == (text, []), fmt


def json_values_only(text: str) -> bool:
    """Whether ``text`` is JSON values only (Llama 3's call shape when they are objects)."""
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


# --- the format, from the template -------------------------------------------------------


def test_the_format_is_picked_from_the_template_and_vocabulary() -> None:
    src = (TEMPLATES / "qwen2.5.jinja").read_text(encoding="utf-8")
    assert tool_call_format(src) == "hermes"
    harmony = (TEMPLATES / "gpt-oss.jinja").read_text(encoding="utf-8")
    assert tool_call_format(harmony) == "harmony"
    assert tool_call_format(None, ["<|channel|>", "<|message|>", "<|call|>"]) == "harmony"
    assert tool_call_format("{{ '[TOOL_CALLS]' + tool_calls|tojson }}") == "mistral"
    assert tool_call_format("{{ '<|start_header_id|>ipython<|end_header_id|>' }}") == "llama3"
    # Templates with no tools at all: calls are not looked for.
    for plain_template in ("chatml.jinja", "llama3.jinja", "mistral.jinja", "gemma.jinja"):
        assert tool_call_format((TEMPLATES / plain_template).read_text("utf-8")) is None
    with pytest.raises(ValueError, match="tool call format"):
        tool_call_parser("xml")


# --- calls sent back -----------------------------------------------------------------------


def _tokenizer(tmp: Path, added: list[str], types: list[int], template: str) -> Tokenizer:
    from test_reasoning_chat import _gguf

    return Tokenizer.load(_gguf(tmp, added, types, template))


def test_calls_sent_back_render_as_the_model_wrote_them(tmp_path: Path) -> None:
    """OpenAI clients send a call's arguments back as JSON text; Qwen's template writes them
    with ``tojson``, so they are decoded first (else the prompt would hold a quoted string)."""
    src = (TEMPLATES / "qwen2.5.jinja").read_text(encoding="utf-8")
    tok = _tokenizer(tmp_path, ["<|im_start|>", "<|im_end|>"], [3, 3], src)
    msgs = proto._messages(
        [
            {"role": "user", "content": "Weather in Paris?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "18 C"},
        ]
    )
    text = tok.apply_chat_template(msgs, tokenize=False)
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in (
        text
    )
    assert "<tool_response>\n18 C\n</tool_response>" in text
    with pytest.raises(proto.ProtocolError, match=r"tool_calls: must be a list"):
        proto._messages([{"role": "assistant", "content": None, "tool_calls": {"x": 1}}])


def test_mistral_tool_markup_is_kept_in_decoded_text(tmp_path: Path) -> None:
    """``[TOOL_CALLS]`` is a control token; llama-server keeps it in a reply to a request with
    tools so the calls can be read, and so does the tokenizer here (other control tokens are
    still left out)."""
    tok = _tokenizer(tmp_path, ["[TOOL_CALLS]", "[ARGS]", "</s>"], [3, 3, 3], "{{ messages }}")
    ids = tok.encode('[TOOL_CALLS]f[ARGS]{"a": 1}</s>', add_special_tokens=False)
    text = tok.decode(ids)
    assert text == '[TOOL_CALLS]f[ARGS]{"a": 1}'
    assert _named(split_tool_calls(MistralCalls(), text)[1]) == [("f", {"a": 1})]


def test_qwen3_coder_xml_calls_in_the_same_tags() -> None:
    # Qwen3-Coder's chat template writes (and the model answers) its calls as XML.
    text = (
        "Checking.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
        '<parameter=days>\n3\n</parameter>\n<parameter=units>\n{"t": "C"}\n</parameter>\n'
        "</function>\n</tool_call>"
    )
    content, calls = split_tool_calls(Hermes(), text)
    assert content == "Checking.\n"
    assert _named(calls) == [("get_weather", {"city": "Paris", "days": 3, "units": {"t": "C"}})]
    # Text between the parameters, or no function, is not a call: it stays text.
    for bad in (
        "<tool_call><function=f>stray<parameter=a>1</parameter></function></tool_call>",
        "<tool_call><parameter=a>1</parameter></tool_call>",
    ):
        assert split_tool_calls(Hermes(), bad) == (bad, [])
