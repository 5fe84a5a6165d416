"""Chat templates: published templates render as their authors document; hostile ones fail.

The templates in tests/data/chat_templates are the models' own (see the README there); the
expected texts are the renderings their authors document, and cases ported from llama.cpp's
tests/test-chat-template.cpp and mistral.rs's chat template tests.
"""

from __future__ import annotations

import json
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from model_factory import make_tiny, write_gguf, write_safetensors_dir
from tokenizer_factory import bpe_gguf_fields, train_bpe

from rlx_lm.chat_template import ChatTemplate
from rlx_lm.errors import ChatTemplateError, RlxError
from rlx_lm.generation import generate
from rlx_lm.tokenizer import Tokenizer

DATA = Path(__file__).parent / "data" / "chat_templates"
TRAINED = train_bpe()


def template(name: str) -> ChatTemplate:
    return ChatTemplate((DATA / f"{name}.jinja").read_text(encoding="utf-8"), name=name)


# ---------------------------------------------------------------- published templates


def test_chatml_renders_turns_and_the_generation_prompt() -> None:
    msgs = [
        {"role": "system", "content": "You are helpful."},
        {"role": "user", "content": "Hi"},
    ]
    assert template("chatml").render(msgs, add_generation_prompt=True) == (
        "<|im_start|>system\nYou are helpful.<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert template("chatml").render(msgs).endswith("<|im_start|>user\nHi<|im_end|>\n")


def test_llama3_matches_metas_documented_prompt_format() -> None:
    msgs = [
        {"role": "system", "content": "You are a helpful AI assistant for travel tips"},
        {"role": "user", "content": "What is France's capital?"},
    ]
    out = template("llama3").render(
        msgs, add_generation_prompt=True, special_tokens={"bos_token": "<|begin_of_text|>"}
    )
    assert out == (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
        "You are a helpful AI assistant for travel tips<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\n"
        "What is France's capital?<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )


def test_mistral_matches_hugging_faces_guide_and_refuses_bad_roles() -> None:
    chat = [
        {"role": "user", "content": "Hello, how are you?"},
        {"role": "assistant", "content": "I'm doing great. How can I help you today?"},
        {"role": "user", "content": "I'd like to show off how chat templating works!"},
    ]
    special = {"bos_token": "<s>", "eos_token": "</s>"}
    assert template("mistral").render(chat, special_tokens=special) == (
        "<s>[INST] Hello, how are you? [/INST]I'm doing great. How can I help you today?</s> "
        "[INST] I'd like to show off how chat templating works! [/INST]"
    )
    with pytest.raises(ChatTemplateError, match="roles must alternate"):
        template("mistral").render([chat[0], chat[0]], special_tokens=special)


def test_gemma_matches_its_model_card_and_refuses_a_system_turn() -> None:
    out = template("gemma").render(
        [{"role": "user", "content": "Write a hello world program"}],
        add_generation_prompt=True,
        special_tokens={"bos_token": "<bos>"},
    )
    assert out == (
        "<bos><start_of_turn>user\nWrite a hello world program<end_of_turn>\n<start_of_turn>model\n"
    )
    with pytest.raises(ChatTemplateError, match="System role not supported"):
        template("gemma").render([{"role": "system", "content": "x"}])


TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "get_current_temperature",
            "description": "Get current temperature at a location.",
            "parameters": {
                "type": "object",
                "properties": {
                    "location": {
                        "type": "string",
                        "description": 'The location to get the temperature for, in the format "City, State, Country".',  # noqa: E501
                    },
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                },
                "required": ["location"],
            },
        },
    }
]
QWEN_TOOLS_SYSTEM = (
    "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant."
    "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
    '{"type": "function", "function": {"name": "get_current_temperature", "description": '
    '"Get current temperature at a location.", "parameters": {"type": "object", '
    '"properties": {"location": {"type": "string", "description": "The location to get the '
    'temperature for, in the format \\"City, State, Country\\"."}, "unit": {"type": '
    '"string", "enum": ["celsius", "fahrenheit"]}}, "required": ["location"]}}}\n</tools>\n\n'
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
)


def test_qwen25_with_tools_matches_qwens_function_calling_guide() -> None:
    msgs = [{"role": "user", "content": "What's the temperature in San Francisco now?"}]
    out = template("qwen2.5").render(msgs, tools=TOOLS, add_generation_prompt=True)
    assert out == (
        QWEN_TOOLS_SYSTEM
        + "<|im_start|>user\nWhat's the temperature in San Francisco now?<|im_end|>\n"
        + "<|im_start|>assistant\n"
    )


def test_qwen25_renders_tool_calls_and_tool_results() -> None:
    call = {"name": "get_current_temperature", "arguments": {"location": "San Francisco"}}
    msgs: list[dict[str, Any]] = [
        {"role": "user", "content": "How warm is it?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"type": "function", "function": call}],
        },
        {"role": "tool", "content": '{"temperature": 26.1}'},
        {"role": "tool", "content": '{"temperature": 25.9}'},
    ]
    out = template("qwen2.5").render(msgs, tools=TOOLS, add_generation_prompt=True)
    assert out == (
        QWEN_TOOLS_SYSTEM
        + "<|im_start|>user\nHow warm is it?<|im_end|>\n"
        + "<|im_start|>assistant\n<tool_call>\n"
        + '{"name": "get_current_temperature", "arguments": {"location": "San Francisco"}}'
        + "\n</tool_call><|im_end|>\n"
        + "<|im_start|>user\n<tool_response>\n"
        + '{"temperature": 26.1}\n</tool_response>\n<tool_response>\n'
        + '{"temperature": 25.9}\n</tool_response><|im_end|>\n'
        + "<|im_start|>assistant\n"
    )
    # Without tools the template writes its plain default system turn.
    plain = template("qwen2.5").render([msgs[0]])
    assert plain.startswith("<|im_start|>system\nYou are Qwen, created by Alibaba Cloud.")


# ------------------------------------------------- cases ported from other engines' tests

# llama.cpp tests/test-chat-template.cpp renders every template over this conversation with
# add_generation_prompt=True (bos_token and eos_token "" unless a case says otherwise).
LLAMA_CPP_CONVERSATION = [
    {"role": "system", "content": "You are a helpful assistant"},
    {"role": "user", "content": "Hello"},
    {"role": "assistant", "content": "Hi there"},
    {"role": "user", "content": "Who are you"},
    {"role": "assistant", "content": "   I am an assistant   "},
    {"role": "user", "content": "Another question"},
]
# For a template that refuses a system turn, llama.cpp's jinja path folds the system message
# into the first user message ("...assistant\nHello"); its expected text is that rendering.
FOLDED = [
    {"role": "user", "content": "You are a helpful assistant\nHello"},
    *LLAMA_CPP_CONVERSATION[2:],
]
LLAMA_CPP_CASES = [
    (  # "teknium/OpenHermes-2.5-Mistral-7B"
        "chatml",
        LLAMA_CPP_CONVERSATION,
        {},
        "<|im_start|>system\nYou are a helpful assistant<|im_end|>\n<|im_start|>user\nHello"
        "<|im_end|>\n<|im_start|>assistant\nHi there<|im_end|>\n<|im_start|>user\nWho are you"
        "<|im_end|>\n<|im_start|>assistant\n   I am an assistant   <|im_end|>\n<|im_start|>user"
        "\nAnother question<|im_end|>\n<|im_start|>assistant\n",
    ),
    (  # "Llama-3"
        "llama3",
        LLAMA_CPP_CONVERSATION,
        {},
        "<|start_header_id|>system<|end_header_id|>\n\nYou are a helpful assistant<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|><|start_header_id|>assistant"
        "<|end_header_id|>\n\nHi there<|eot_id|><|start_header_id|>user<|end_header_id|>\n\n"
        "Who are you<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nI am an assistant"
        "<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nAnother question<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n",
    ),
    (  # "google/gemma-7b-it" (expected_output_jinja)
        "gemma",
        FOLDED,
        {},
        "<start_of_turn>user\nYou are a helpful assistant\nHello<end_of_turn>\n<start_of_turn>"
        "model\nHi there<end_of_turn>\n<start_of_turn>user\nWho are you<end_of_turn>\n"
        "<start_of_turn>model\nI am an assistant<end_of_turn>\n<start_of_turn>user\nAnother "
        "question<end_of_turn>\n<start_of_turn>model\n",
    ),
]
# EricLBuehler/mistral.rs mistralrs-core/src/pipeline/mod.rs `test_chat_templates`: the same
# conversation (without the system turn for templates that have none), expected texts made
# with transformers' apply_chat_template, bos "<s>"/"<bos>", eos "</s>"/"<eos>".
MISTRAL_RS_CASES = [
    (  # "mistralai/Mistral-7B-Instruct-v0.1"
        "mistral",
        LLAMA_CPP_CONVERSATION[1:],
        {"bos_token": "<s>", "eos_token": "</s>"},
        "<s>[INST] Hello [/INST]Hi there</s> [INST] Who are you [/INST]   I am an assistant   "
        "</s> [INST] Another question [/INST]",
    ),
    (  # "google/gemma-7b-it"
        "gemma",
        LLAMA_CPP_CONVERSATION[1:],
        {"bos_token": "<bos>", "eos_token": "<eos>"},
        "<bos><start_of_turn>user\nHello<end_of_turn>\n<start_of_turn>model\nHi there"
        "<end_of_turn>\n<start_of_turn>user\nWho are you<end_of_turn>\n<start_of_turn>model\n"
        "I am an assistant<end_of_turn>\n<start_of_turn>user\nAnother question<end_of_turn>\n"
        "<start_of_turn>model\n",
    ),
    (  # ChatML: "https://huggingface.co/teknium/OpenHermes-2.5-Mistral-7B"
        "chatml",
        LLAMA_CPP_CONVERSATION,
        {"bos_token": "<s>", "eos_token": "</s>"},
        LLAMA_CPP_CASES[0][3],
    ),
]


@pytest.mark.parametrize(
    ("name", "messages", "special", "want"),
    [*LLAMA_CPP_CASES, *MISTRAL_RS_CASES],
    ids=[f"llama.cpp-{c[0]}" for c in LLAMA_CPP_CASES]
    + [f"mistral.rs-{c[0]}" for c in MISTRAL_RS_CASES],
)
def test_other_engines_expected_renderings(
    name: str, messages: list[dict[str, str]], special: dict[str, str], want: str
) -> None:
    got = template(name).render(
        messages, add_generation_prompt=True, special_tokens=special or {"bos_token": ""}
    )
    assert got == want


def test_smollm2_is_chatml_with_a_default_system_turn() -> None:
    user = [{"role": "user", "content": "What is the capital of France?"}]
    assert template("smollm2").render(user, add_generation_prompt=True) == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
        "Face<|im_end|>\n<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    # with a system turn of its own it is ChatML exactly
    msgs = LLAMA_CPP_CONVERSATION
    assert template("smollm2").render(msgs, add_generation_prompt=True) == LLAMA_CPP_CASES[0][3]


# ------------------------------------------------------------ Hugging Face conventions


def test_tojson_is_hugging_faces_not_jinjas() -> None:
    # Jinja's own filter escapes <, >, & and ' for HTML and sorts keys; HF's does neither.
    t = ChatTemplate("{{ x | tojson }}|{{ x | tojson(indent=2) }}|{{ x | tojson(sort_keys=true) }}")
    x = {"b": "<é & 'q'>", "a": 1}
    assert t.render([], x=x) == "|".join(
        [json.dumps(x, ensure_ascii=False), json.dumps(x, ensure_ascii=False, indent=2),
         json.dumps(x, ensure_ascii=False, sort_keys=True)]
    )  # fmt: skip


def test_globals_extensions_and_whitespace_control_follow_hugging_face() -> None:
    t = ChatTemplate(
        "{{ strftime_now('%Y') }}\n"
        "{% for m in messages %}\n"
        "  {% if loop.index > 2 %}{% break %}{% endif %}\n"
        "  {% generation %}{{ m.content }}{% endgeneration %};\n"
        "{% endfor %}\n"
    )
    msgs = [{"role": "user", "content": c} for c in "abc"]
    # trim_blocks eats the newline after a block tag, lstrip_blocks the indentation before
    # one (both lines start with a tag), the template's final newline is dropped, and break
    # comes from loopcontrols.
    assert t.render(msgs) == f"{datetime.now().year}\na;\nb;\n"


def test_extra_keywords_and_documents_reach_the_template() -> None:
    t = ChatTemplate("{{ enable_thinking }}:{{ documents | length }}:{{ tools is none }}")
    assert t.render([], enable_thinking=False, documents=[{"text": "d"}]) == "False:1:True"


def test_continue_final_message_ends_the_prompt_inside_the_last_turn() -> None:
    msgs = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Sure, "}]
    out = template("chatml").render(msgs, continue_final_message=True)
    assert out.endswith("<|im_start|>assistant\nSure,")
    with pytest.raises(ChatTemplateError, match="cannot both"):
        template("chatml").render(msgs, continue_final_message=True, add_generation_prompt=True)


def test_messages_must_be_mappings_with_roles() -> None:
    with pytest.raises(ChatTemplateError, match="role"):
        template("chatml").render([{"content": "x"}])
    with pytest.raises(ChatTemplateError, match="list"):
        template("chatml").render("hello")  # type: ignore[arg-type]


def test_the_template_cannot_change_the_callers_messages() -> None:
    msgs = [{"role": "user", "content": "x"}]
    with pytest.raises(ChatTemplateError, match="unsafe"):
        ChatTemplate("{{ messages.append({'role': 'x'}) }}").render(msgs)
    with pytest.raises(ChatTemplateError, match="unsafe"):
        ChatTemplate("{{ messages[0].update({'role': 'x'}) }}").render(msgs)
    assert msgs == [{"role": "user", "content": "x"}]


# -------------------------------------------------------------------- hostile templates

HOSTILE = {
    "include a file": "{% include '/etc/passwd' %}",
    "import a file": "{% import '/etc/passwd' as x %}",
    "extend a file": "{% extends '/etc/passwd' %}",
    "reach python internals": "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "nested loops": "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",  # noqa: E501
    "a loop that builds output": "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}",  # noqa: E501
    "unbounded recursion": "{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}",
    "exponential recursion": "{% macro f(n) %}{% if n < 60 %}{{ f(n+1) }}{{ f(n+1) }}{% endif %}{% endmacro %}{{ f(0) }}",  # noqa: E501
    "string repetition": "{{ 'x' * 10**10 }}",
    "list repetition": "{{ [1] * 10**9 }}",
    "huge power": "{{ 9 ** 999999999 }}",
    "doubling a namespace value": "{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",  # noqa: E501
    "doubling through calls": "{% macro d(s, n) %}{% if n %}{{ d(s ~ s, n - 1) }}{% endif %}{% endmacro %}{{ d('ab', 64) }}",  # noqa: E501
    "a wide filter": "{{ 'x' | center(10**10) }}",
    "a wide method": "{{ 'x'.ljust(10**10) }}",
    "a wide format": "{{ '{:>9999999999}'.format(1) }}",
    "a wide percent format": "{{ '%9999999999s' % 'x' }}",
    "a growing replace": "{% set s = 'a' * 1000000 %}{{ s.replace('a', 'a' * 1000) }}",
    "a syntax error": "{% for %}",
}


@pytest.mark.parametrize("source", HOSTILE.values(), ids=HOSTILE.keys())
def test_hostile_templates_are_refused_quickly(source: str) -> None:
    t0 = time.monotonic()
    with pytest.raises(ChatTemplateError) as info:
        ChatTemplate(source, timeout=0.5, max_output=1 << 22).render(
            [{"role": "user", "content": "hi"}]
        )
    assert isinstance(info.value, RlxError)
    assert isinstance(info.value, ValueError)
    # Bounded: the time limit (0.5 s) plus slack for a loaded machine, never a hang.
    assert time.monotonic() - t0 < 20


def test_unsafe_attributes_are_undefined_and_leak_nothing() -> None:
    for source in ("{{ raise_exception.__globals__ }}", "{{ messages.__class__ }}"):
        assert ChatTemplate(source).render([{"role": "user", "content": "x"}]) == ""


def test_the_time_limit_stops_a_template_that_loops_without_output() -> None:
    t = ChatTemplate(HOSTILE["nested loops"], timeout=0.2)
    with pytest.raises(ChatTemplateError, match=r"longer than 0\.2 s"):
        t.render([])


def test_budgets_leave_normal_templates_and_the_callers_tracer_alone() -> None:
    import sys

    seen: list[str] = []

    def tracer(frame: Any, event: str, arg: Any) -> None:
        seen.append(event)

    sys.settrace(tracer)
    try:
        out = template("chatml").render([{"role": "user", "content": "x" * 100_000}])
    finally:
        current = sys.gettrace()
        sys.settrace(None)
    assert current is tracer
    assert len(out) > 100_000
    assert ChatTemplate("{{ 'ab' * 3 }}{{ 2 ** 10 }}").render([]) == "ababab1024"


def test_a_raise_exception_message_reaches_the_caller() -> None:
    with pytest.raises(ChatTemplateError, match="tools are not supported"):
        ChatTemplate("{{ raise_exception('tools are not supported') }}").render([])


def test_an_oversized_template_is_refused() -> None:
    with pytest.raises(ChatTemplateError, match="characters"):
        ChatTemplate("x" * ((1 << 20) + 1))


# ------------------------------------------------------------------ Tokenizer integration

CHATML = (DATA / "chatml.jinja").read_text(encoding="utf-8")
IM_START, IM_END = "<|im_start|>", "<|im_end|>"


def chatml_fields(**extra: Any) -> dict[str, Any]:
    """The trained BPE with ChatML's control tokens appended, and a ChatML template."""
    fields = bpe_gguf_fields(TRAINED)
    fields["tokenizer.ggml.tokens"] = [*fields["tokenizer.ggml.tokens"], IM_START, IM_END]
    fields["tokenizer.ggml.token_type"] = [*fields["tokenizer.ggml.token_type"], 3, 3]
    fields["tokenizer.ggml.add_bos_token"] = False
    fields["tokenizer.chat_template"] = CHATML
    fields.update(extra)
    return fields


def chatml_gguf(tmp_path: Path, **extra: Any) -> Path:
    fields = chatml_fields(**extra)
    vocab = len(fields["tokenizer.ggml.tokens"])
    return write_gguf(make_tiny(vocab=vocab), tmp_path / "chat.gguf", tokenizer=fields)


def test_apply_chat_template_from_a_gguf_header(tmp_path: Path) -> None:
    tok = Tokenizer.load(chatml_gguf(tmp_path))
    msgs = [{"role": "user", "content": "hello world"}]
    text = tok.apply_chat_template(msgs, tokenize=False)
    assert text == "<|im_start|>user\nhello world<|im_end|>\n<|im_start|>assistant\n"
    ids = tok.apply_chat_template(msgs)
    assert ids == tok.encode(str(text), add_special_tokens=False)
    n = len(TRAINED.get_vocab())
    assert ids[0] == n, "control tokens are single ids"
    assert ids.count(n + 1) == 1
    assert tok.apply_chat_template(msgs, add_generation_prompt=False, tokenize=False) == (
        "<|im_start|>user\nhello world<|im_end|>\n"
    )


def test_the_templates_end_of_turn_token_stops_generation(tmp_path: Path) -> None:
    tok = Tokenizer.load(chatml_gguf(tmp_path))
    im_end = len(TRAINED.get_vocab()) + 1
    assert im_end in tok.stop_token_ids
    assert tok.is_eos(im_end)
    assert tok.eos_ids == {TRAINED.token_to_id("<|eos|>")}

    class Says:
        """Greedy continuation: 'hello', then <|im_end|>, then 'world'."""

        family = "says"
        vocab_size = im_end + 1

        def __init__(self, script: list[int], start: int) -> None:
            self.script, self.start = script, start

        def predict_logits(self, ids: Any) -> np.ndarray:
            logits = np.zeros(self.vocab_size, dtype=np.float32)
            logits[self.script[min(len(ids) - self.start, len(self.script) - 1)]] = 9.0
            return logits

    prompt = tok.apply_chat_template([{"role": "user", "content": "hi"}])
    assert isinstance(prompt, list)
    hello = tok.encode("hello", add_special_tokens=False)
    world = tok.encode(" world", add_special_tokens=False)
    res = generate(Says([*hello, im_end, *world], len(prompt)), tok, prompt, max_tokens=20)
    assert (res.text, res.stop_reason) == ("hello", "eos")


def test_gguf_end_of_turn_fields_stop_generation(tmp_path: Path) -> None:
    eos = TRAINED.token_to_id("<|eos|>")
    fields = chatml_fields()
    del fields["tokenizer.chat_template"]
    fields["tokenizer.ggml.eot_token_id"] = 5
    path = write_gguf(make_tiny(vocab=302), tmp_path / "m.gguf", tokenizer=fields)
    tok = Tokenizer.load(path)
    # eot_token_id, and <|im_end|> as a control token llama.cpp ends generation on.
    assert tok.stop_token_ids == {eos, 5, len(TRAINED.get_vocab()) + 1}
    assert tok.chat_template is None
    with pytest.raises(ChatTemplateError, match="no chat template"):
        tok.apply_chat_template([{"role": "user", "content": "x"}])
    # A template given by the caller works all the same, as text or as a file.
    f = tmp_path / "t.jinja"
    f.write_text("{{ messages[0].content }}!")
    assert tok.apply_chat_template([{"role": "user", "content": "x"}], chat_template=f) == (
        tok.encode("x!", add_special_tokens=False)
    )
    tok.set_chat_template(CHATML)
    assert tok.apply_chat_template([{"role": "user", "content": "x"}], tokenize=False) == (
        "<|im_start|>user\nx<|im_end|>\n<|im_start|>assistant\n"
    )


def test_named_gguf_templates_and_tool_use_selection(tmp_path: Path) -> None:
    path = chatml_gguf(
        tmp_path,
        **{
            "tokenizer.chat_template.tool_use": "TOOLS:{{ tools | length }}",
            "tokenizer.chat_template.rag": "RAG",
        },
    )
    tok = Tokenizer.load(path)
    msgs = [{"role": "user", "content": "x"}]
    assert tok.chat_templates.names() == ["default", "rag", "tool_use"]
    assert tok.apply_chat_template(msgs, tools=TOOLS, tokenize=False) == "TOOLS:1"
    assert tok.apply_chat_template(msgs, chat_template="rag", tokenize=False) == "RAG"
    assert str(tok.apply_chat_template(msgs, tokenize=False)).startswith(IM_START)
    # A string that names no template is template text, as in Hugging Face.
    assert tok.apply_chat_template(msgs, chat_template="raw", tokenize=False) == "raw"


def test_a_broken_template_in_the_file_fails_on_use_not_on_load(tmp_path: Path) -> None:
    tok = Tokenizer.load(chatml_gguf(tmp_path, **{"tokenizer.chat_template": "{% for %}"}))
    assert tok.encode("hello") == TRAINED.encode("hello").ids
    with pytest.raises(ChatTemplateError, match="syntax error"):
        tok.apply_chat_template([{"role": "user", "content": "x"}])


def test_model_directory_templates(tmp_path: Path) -> None:
    m = make_tiny(vocab=300)
    m.tokenizer_json = TRAINED.to_str()
    d = write_safetensors_dir(m, tmp_path / "m")
    config = {
        "bos_token": {"content": "<|bos|>"},
        "eos_token": "<|eos|>",
        "chat_template": [
            {"name": "default", "template": "{{ bos_token }}D{{ messages | length }}"},
            {"name": "tool_use", "template": "T"},
        ],
    }
    (d / "tokenizer_config.json").write_text(json.dumps(config))
    msgs = [{"role": "user", "content": "x"}]
    tok = Tokenizer.load(d)
    assert tok.special_tokens["bos_token"] == "<|bos|>"
    assert tok.apply_chat_template(msgs, tokenize=False) == "<|bos|>D1"
    assert tok.apply_chat_template(msgs, tools=TOOLS, tokenize=False) == "T"
    # chat_template.jinja wins over the config's default, as in Hugging Face.
    (d / "chat_template.jinja").write_text("J{{ eos_token }}")
    assert Tokenizer.load(d).apply_chat_template(msgs, tokenize=False) == "J<|eos|>"
    # A file given by the user: a .jinja, or a tokenizer_config.json.
    assert ChatTemplate.from_file(d / "tokenizer_config.json").source.startswith("{{ bos_token")
    with pytest.raises(ChatTemplateError, match="cannot read"):
        ChatTemplate.from_file(d / "missing.jinja")


def test_public_names_are_exported() -> None:
    import rlx_lm

    assert rlx_lm.ChatTemplate is ChatTemplate
    assert issubclass(rlx_lm.ChatTemplateError, rlx_lm.RlxError)


def test_a_bos_the_tokenizer_adds_is_kept_once(tmp_path: Path) -> None:
    bos = TRAINED.token_to_id("<|bos|>")
    path = chatml_gguf(tmp_path, **{"tokenizer.ggml.add_bos_token": True})
    tok = Tokenizer.load(path)
    msgs = [{"role": "user", "content": "x"}]
    ids = tok.apply_chat_template(msgs)
    assert isinstance(ids, list)
    assert ids[0] == bos, "the template wrote no BOS: one is added"
    assert ids.count(bos) == 1
    with_bos = tok.apply_chat_template(msgs, chat_template="{{ bos_token }}hi")
    assert with_bos == [bos, *TRAINED.encode("hi").ids], "the template's own BOS is not doubled"
