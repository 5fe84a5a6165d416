"""`rlx-lm serve` end to end: a real uvicorn on loopback, the official `openai` client, raw
HTTP for the SSE framing; results compared with `rlx_lm.generate` on a second copy of the
same model (the reference never shares the server's runner)."""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest

import rlx_lm
from rlx_lm import SampleOpts
from rlx_lm.server import ServerConfig, create_app
from tests.server_harness import FaultyRunner, LiveServer, SlowSteps, live_server

MAX_SEQ = 384
PROMPT = "It is a truth universally acknowledged"


@pytest.fixture(scope="module")
def model() -> tuple[Any, Any]:
    return rlx_lm.load_default(max_seq=MAX_SEQ)


def fresh(model: tuple[Any, Any], max_seq: int = MAX_SEQ) -> tuple[Any, Any]:
    """Another runner over the same weights: a runner belongs to one scheduler thread."""
    runner, tok = model
    return runner.clone(max_seq=max_seq), tok


@pytest.fixture(scope="module")
def reference(model: tuple[Any, Any]) -> tuple[Any, Any]:
    """A second runner for expected outputs: the server's runner is its thread's alone."""
    return fresh(model)


@pytest.fixture(scope="module")
def server(model: tuple[Any, Any]) -> Iterator[LiveServer]:
    runner, tok = fresh(model)
    app = create_app(runner, tok, config=ServerConfig(model_name="austen", max_batch=8))
    with live_server(app) as s:
        yield s


@pytest.fixture
def client(server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0, timeout=60)


def expected(reference: tuple[Any, Any], prompt: str, n: int, **opts: Any) -> Any:
    runner, tok = reference
    return rlx_lm.generate(runner, tok, prompt, opts=SampleOpts(**opts), max_tokens=n)


# ----------------------------------------------------------------- basics


def test_models_health_and_metrics(server: LiveServer, client: openai.OpenAI) -> None:
    models = client.models.list()
    assert [m.id for m in models.data] == ["austen"]
    assert httpx.get(f"{server.url}/health").json() == {"status": "ok"}
    assert httpx.get(f"{server.url}/v1/models/austen").json()["max_model_len"] == MAX_SEQ
    assert httpx.get(f"{server.url}/v1/models/nope").status_code == 404
    client.completions.create(model="austen", prompt=PROMPT, max_tokens=3, seed=1)
    r = httpx.get(f"{server.url}/metrics")
    assert r.headers["content-type"].startswith("text/plain")
    text = r.text
    for name in (
        "rlx_lm_requests_total",
        "rlx_lm_generation_tokens_total",
        "rlx_lm_queue_depth",
        "rlx_lm_batch_size_bucket",
        "rlx_lm_prompt_cache_hit_rate",
        "rlx_lm_time_to_first_token_seconds_count",
    ):
        assert name in text
    assert 'rlx_lm_requests_total{endpoint="/v1/completions",status="200"}' in text
    samples = [ln for ln in text.splitlines() if ln and not ln.startswith("#")]
    for ln in samples:  # every sample line is `name{labels} number`
        float(ln.rsplit(" ", 1)[1])


def test_completion_equals_the_library(client: openai.OpenAI, reference: tuple[Any, Any]) -> None:
    r = client.completions.create(
        model="austen", prompt=PROMPT, max_tokens=24, temperature=0.9, top_p=0.95, seed=11
    )
    want = expected(reference, PROMPT, 24, temperature=0.9, top_p=0.95, seed=11)
    assert r.choices[0].text == want.text
    assert r.object == "text_completion"
    assert r.usage is not None
    assert r.usage.prompt_tokens == want.prompt_tokens
    assert r.usage.completion_tokens == 24
    assert r.choices[0].finish_reason == "length"


def test_greedy_knobs_by_llama_server_names(
    client: openai.OpenAI, reference: tuple[Any, Any]
) -> None:
    # top_k=1 at temperature 1 is greedy; repeat_penalty is llama-server's name.
    r = client.completions.create(
        model="austen",
        prompt=PROMPT,
        max_tokens=16,
        extra_body={"top_k": 1, "repeat_penalty": 1.3, "repeat_last_n": 32},
    )
    want = expected(
        reference,
        PROMPT,
        16,
        temperature=1.0,
        top_k=1,
        repetition_penalty=1.3,
        repetition_window=32,
        seed=0,
    )
    assert r.choices[0].text == want.text
    r2 = client.completions.create(
        model="austen",
        prompt=PROMPT,
        max_tokens=16,
        temperature=0,
        extra_body={"repetition_penalty": 1.3, "repeat_last_n": 32},
    )
    assert r2.choices[0].text == want.text


def test_logit_bias_bans_the_greedy_token(
    client: openai.OpenAI, reference: tuple[Any, Any]
) -> None:
    runner, tok = reference
    first = int(np.argmax(runner.predict_logits(tok.encode(PROMPT))))
    r = client.completions.create(
        model="austen",
        prompt=PROMPT,
        max_tokens=1,
        temperature=0,
        logit_bias={str(first): -100},
        logprobs=1,
    )
    assert r.choices[0].logprobs is not None
    assert r.choices[0].logprobs.tokens != [tok.decode([first], skip_special_tokens=False)]
    r2 = client.completions.create(
        model="austen", prompt=PROMPT, max_tokens=1, temperature=0, logprobs=1
    )
    assert r2.choices[0].logprobs is not None
    assert r2.choices[0].logprobs.tokens == [tok.decode([first], skip_special_tokens=False)]


def test_seed_gives_the_same_text_and_another_seed_another(client: openai.OpenAI) -> None:
    def once(seed: int) -> str:
        r = client.completions.create(
            model="austen", prompt=PROMPT, max_tokens=20, temperature=1.2, seed=seed
        )
        return r.choices[0].text

    a = once(5)
    assert once(5) == a
    assert any(once(s) != a for s in (6, 7, 8))


def test_n_choices_are_sequences_0_to_n_minus_1(client: openai.OpenAI) -> None:
    r = client.completions.create(
        model="austen", prompt=PROMPT, max_tokens=12, temperature=1.0, seed=3, n=3
    )
    assert [c.index for c in r.choices] == [0, 1, 2]
    one = client.completions.create(
        model="austen", prompt=PROMPT, max_tokens=12, temperature=1.0, seed=3
    )
    assert r.choices[0].text == one.choices[0].text  # choice 0 is the n=1 sequence
    assert len({c.text for c in r.choices}) > 1
    assert r.usage is not None
    assert r.usage.completion_tokens == 36


def test_a_list_of_prompts_gives_choices_in_order(client: openai.OpenAI) -> None:
    prompts = [PROMPT, "She was"]
    r = client.completions.create(model="austen", prompt=prompts, max_tokens=6, temperature=0)
    for i, p in enumerate(prompts):
        alone = client.completions.create(model="austen", prompt=p, max_tokens=6, temperature=0)
        assert r.choices[i].index == i
        assert r.choices[i].text == alone.choices[0].text


def test_token_prompt(client: openai.OpenAI, reference: tuple[Any, Any]) -> None:
    _, tok = reference
    ids = tok.encode(PROMPT)
    a = client.completions.create(model="austen", prompt=ids, max_tokens=8, temperature=0)
    b = client.completions.create(model="austen", prompt=PROMPT, max_tokens=8, temperature=0)
    assert a.choices[0].text == b.choices[0].text


# ----------------------------------------------------------------- chat


def test_chat_completion(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model="austen",
        messages=[
            {"role": "system", "content": "You are Miss Bennet."},
            {"role": "user", "content": [{"type": "text", "text": "Who is Mr Darcy?"}]},
        ],
        max_completion_tokens=10,
        temperature=0,
    )
    assert r.object == "chat.completion"
    msg = r.choices[0].message
    assert msg.role == "assistant"
    assert msg.content
    assert r.choices[0].finish_reason == "length"
    assert r.usage is not None
    assert r.usage.completion_tokens == 10


def test_eos_ends_a_chat_turn_with_stop(client: openai.OpenAI, reference: tuple[Any, Any]) -> None:
    _, tok = reference
    (eos,) = sorted(tok.eos_ids)[:1]
    r = client.chat.completions.create(
        model="austen",
        messages=[{"role": "user", "content": "Hello"}],
        max_tokens=10,
        logit_bias={str(eos): 100},
    )
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].message.content == ""
    assert r.usage is not None
    assert r.usage.completion_tokens == 1
    more = client.chat.completions.create(
        model="austen",
        messages=[{"role": "user", "content": "Hello"}],
        max_tokens=3,
        logit_bias={str(eos): 100},
        extra_body={"ignore_eos": True},
    )
    assert more.choices[0].finish_reason == "length"


def test_chat_uses_the_models_template(model: tuple[Any, Any]) -> None:
    from pathlib import Path

    from rlx_lm.default_model import default_model_path
    from rlx_lm.tokenizer import Tokenizer

    tok = Tokenizer.load(default_model_path())  # its own: the template is set on it
    chatml = Path(__file__).parent / "data" / "chat_templates" / "chatml.jinja"
    tok.set_chat_template(chatml)
    runner, _ = fresh(model)
    ref, _ = fresh(model)
    messages = [
        {"role": "system", "content": "You are Miss Bennet."},
        {"role": "user", "content": "Who is Mr Darcy?"},
    ]
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    assert isinstance(ids, list)
    want = rlx_lm.generate(ref, tok, ids, opts=SampleOpts(), max_tokens=8)
    app = create_app(runner, tok, config=ServerConfig(model_name="m"))
    with live_server(app) as s:
        c = openai.OpenAI(base_url=f"{s.url}/v1", api_key="x", max_retries=0)
        r = c.chat.completions.create(
            model="m",
            messages=messages,  # type: ignore[arg-type]
            max_tokens=8,
            temperature=0,
        )
        assert r.usage is not None
        assert r.usage.prompt_tokens == len(ids)
        assert r.choices[0].message.content == want.text


def test_a_template_that_raises_is_a_400(model: tuple[Any, Any]) -> None:
    from rlx_lm.default_model import default_model_path
    from rlx_lm.tokenizer import Tokenizer

    tok = Tokenizer.load(default_model_path())
    tok.set_chat_template(
        "{% if messages[0]['role'] != 'user' %}{{ raise_exception('begin with a user') }}"
        "{% endif %}{% for m in messages %}{{ m['content'] }}{% endfor %}"
    )
    runner, _ = fresh(model)
    app = create_app(runner, tok, config=ServerConfig(model_name="m"))
    with live_server(app) as s:
        ok = httpx.post(
            f"{s.url}/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "Emma"}], "max_tokens": 1},
            timeout=30,
        )
        assert ok.status_code == 200
        bad = httpx.post(
            f"{s.url}/v1/chat/completions",
            json={"messages": [{"role": "assistant", "content": "Emma"}], "max_tokens": 1},
            timeout=30,
        )
        assert bad.status_code == 400
        assert bad.json()["error"]["param"] == "messages"
        assert "begin with a user" in bad.json()["error"]["message"]


def test_chat_streaming_chunks(client: openai.OpenAI) -> None:
    kw: dict[str, Any] = {
        "model": "austen",
        "messages": [{"role": "user", "content": "Tell me of Pemberley."}],
        "max_tokens": 12,
        "temperature": 0.7,
        "seed": 9,
    }
    whole = client.chat.completions.create(**kw)
    chunks = list(
        client.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True})
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finals = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finals[-1] == "length"
    assert all(f is None for f in finals[:-1])
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None
    assert whole.usage is not None
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert all(c.id == chunks[0].id for c in chunks)


def test_chat_logprobs_are_the_models(client: openai.OpenAI, reference: tuple[Any, Any]) -> None:
    from rlx_lm.server.protocol import render_chat

    runner, tok = reference
    messages = [{"role": "user", "content": "Speak of Bath."}]
    r = client.chat.completions.create(
        model="austen",
        messages=messages,  # type: ignore[arg-type]
        max_tokens=4,
        temperature=0,
        logprobs=True,
        top_logprobs=3,
    )
    lp = r.choices[0].logprobs
    assert lp is not None
    assert lp.content is not None
    assert len(lp.content) == 4
    # float64 reference: log-softmax of the model's first-position logits
    prompt = render_chat(tok, [{"role": "user", "content": "Speak of Bath."}])
    logits = np.asarray(runner.predict_logits(prompt), dtype=np.float64)
    ref = logits - (logits.max() + math.log(np.exp(logits - logits.max()).sum()))
    best = np.argsort(-ref)[:3]
    first = lp.content[0]
    assert first.logprob == pytest.approx(ref[best[0]], abs=1e-3)
    assert [t.logprob for t in first.top_logprobs] == pytest.approx(list(ref[best]), abs=1e-3)
    assert first.token == tok.decode([int(best[0])], skip_special_tokens=False)
    assert first.bytes == list(first.token.encode())


def test_completion_logprobs_shape(client: openai.OpenAI) -> None:
    r = client.completions.create(
        model="austen", prompt=PROMPT, max_tokens=5, temperature=0, logprobs=2
    )
    lp = r.choices[0].logprobs
    assert lp is not None
    assert lp.tokens is not None
    assert lp.token_logprobs is not None
    assert lp.top_logprobs is not None
    assert lp.text_offset is not None
    assert "".join(lp.tokens) == r.choices[0].text
    assert len(lp.token_logprobs) == 5
    assert all(len(t) <= 2 for t in lp.top_logprobs)
    assert all(v <= 0 for v in lp.token_logprobs)
    assert lp.text_offset[0] == 0
    assert lp.text_offset[1] == len(lp.tokens[0])


def test_logprobs_do_not_change_the_draw(client: openai.OpenAI) -> None:
    kw: dict[str, Any] = {"model": "austen", "prompt": PROMPT, "max_tokens": 16, "seed": 21}
    a = client.completions.create(**kw, temperature=1.1)
    b = client.completions.create(**kw, temperature=1.1, logprobs=3)
    assert a.choices[0].text == b.choices[0].text


# ----------------------------------------------------------------- stop


def test_stop_string_across_tokens_is_never_emitted(
    client: openai.OpenAI, reference: tuple[Any, Any]
) -> None:
    _, tok = reference
    free = expected(reference, PROMPT, 40, temperature=0).text
    pieces = [tok.decode([t]) for t in tok.encode(free, add_special_tokens=False)]
    # a stop string that starts inside one token and ends inside a later one
    start = len(pieces[0]) + len(pieces[1]) - 1
    stop = free[start : start + 4]
    assert len(stop) == 4
    cut = free.index(stop)
    for stream in (False, True):
        if stream:
            parts = client.completions.create(
                model="austen",
                prompt=PROMPT,
                max_tokens=40,
                temperature=0,
                stop=[stop],
                stream=True,
            )
            chunks = list(parts)
            text = "".join(c.choices[0].text for c in chunks)
            reason = chunks[-1].choices[0].finish_reason
        else:
            r = client.completions.create(
                model="austen", prompt=PROMPT, max_tokens=40, temperature=0, stop=stop
            )
            text, reason = r.choices[0].text, r.choices[0].finish_reason
        assert text == free[:cut]
        assert stop not in text
        assert reason == "stop"


def test_stop_token_ids_and_ignore_eos(client: openai.OpenAI, reference: tuple[Any, Any]) -> None:
    _, tok = reference
    free = expected(reference, PROMPT, 10, temperature=0)
    third = free.tokens[2]
    r = client.completions.create(
        model="austen",
        prompt=PROMPT,
        max_tokens=10,
        temperature=0,
        extra_body={"stop_token_ids": [third]},
    )
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].text == tok.decode(free.tokens[:2])


# ----------------------------------------------------------------- SSE framing


def test_sse_framing_raw(server: LiveServer) -> None:
    body = {"model": "austen", "prompt": PROMPT, "max_tokens": 6, "stream": True, "seed": 1}
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=60) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        raw = r.read().decode()
    assert raw.endswith("data: [DONE]\n\n")
    events = raw.split("\n\n")
    assert events[-1] == ""
    events = events[:-1]
    for ev in events:
        assert ev.startswith("data: ")
        assert "\n" not in ev
    payloads = [json.loads(ev[6:]) for ev in events[:-1]]
    assert all(p["object"] == "text_completion" for p in payloads)
    assert payloads[-1]["choices"][0]["finish_reason"] == "length"


def test_chat_sse_framing_raw(server: LiveServer) -> None:
    body = {
        "messages": [{"role": "user", "content": "Hello"}],
        "max_tokens": 4,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    with httpx.stream("POST", f"{server.url}/v1/chat/completions", json=body, timeout=60) as r:
        raw = r.read().decode()
    events = [e for e in raw.split("\n\n") if e]
    assert events[-1] == "data: [DONE]"
    payloads = [json.loads(e[6:]) for e in events[:-1]]
    assert payloads[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert all(p["object"] == "chat.completion.chunk" for p in payloads)
    assert all("usage" in p for p in payloads)
    assert payloads[-1]["usage"]["completion_tokens"] == 4


# ----------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"temperature": -1}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"top_k": -5}, "top_k"),
        ({"min_p": 2}, "min_p"),
        ({"frequency_penalty": 3}, "frequency_penalty"),
        ({"repeat_penalty": 0}, "repeat_penalty"),
        ({"repeat_last_n": 0}, "repeat_last_n"),
        ({"mirostat": 3}, "mirostat"),
        ({"xtc_probability": 0.5, "xtc_threshold": 0}, "xtc_threshold"),
        ({"dry_base": 0.5}, "dry_base"),
        ({"logit_bias": {"99999": 1}}, "logit_bias"),
        ({"logit_bias": {"5": 500}}, "logit_bias"),
        ({"samplers": ["top_k", "bogus"]}, "samplers"),
        ({"samplers": ["top_k"], "top_p": 0.5}, "samplers"),
        ({"seed": "x"}, "seed"),
        ({"n": 0}, "n"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": 10**6}, "max_tokens"),
        ({"stop": 5}, "stop"),
        ({"echo": True}, "echo"),
        ({"frobnicate": 1}, "frobnicate"),
        ({"prompt": [1, 99999]}, "prompt"),
    ],
)
def test_bad_field_is_a_400_naming_it(
    server: LiveServer, extra: dict[str, Any], param: str
) -> None:
    body = {"model": "austen", "prompt": PROMPT, "max_tokens": 2, **extra}
    r = httpx.post(f"{server.url}/v1/completions", json=body, timeout=60)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param
    assert param in err["message"]
    assert err["type"] == "invalid_request_error"


def test_errors_through_the_client(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(
            model="austen", messages=[{"role": "user", "content": "x"}], temperature=5
        )
    assert bad.value.param == "temperature"
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="gpt-9", prompt="x", max_tokens=1)
    with pytest.raises(openai.BadRequestError) as long:
        client.completions.create(model="austen", prompt="word " * 500, max_tokens=1)
    assert long.value.code == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError) as role:
        client.chat.completions.create(
            model="austen",
            messages=[{"role": "wizard", "content": "x"}],  # type: ignore[misc,list-item]
        )
    assert role.value.param == "messages[0].role"


def test_bad_json_and_unknown_route(server: LiveServer) -> None:
    r = httpx.post(
        f"{server.url}/v1/completions",
        content=b"{not json",
        timeout=10,
        headers={"content-type": "application/json"},
    )
    assert r.status_code == 400
    assert "JSON" in r.json()["error"]["message"]
    r = httpx.get(f"{server.url}/v2/nothing", timeout=10)
    assert r.status_code == 404
    assert "error" in r.json()
    r = httpx.get(f"{server.url}/v1/completions", timeout=10)
    assert r.status_code == 405


def test_ignored_openai_fields_are_accepted(client: openai.OpenAI) -> None:
    r = client.completions.create(
        model="austen", prompt=PROMPT, max_tokens=2, user="someone", temperature=0
    )
    assert r.choices[0].text


# ----------------------------------------------------------------- cache, limits


def test_prefix_cache_reuses_a_shared_system_prompt(
    model: tuple[Any, Any], reference: tuple[Any, Any]
) -> None:
    runner, tok = fresh(model)
    app = create_app(runner, tok, config=ServerConfig(model_name="m"))
    system = "It is a truth universally acknowledged, that a single man in possession " * 4
    with live_server(app) as s:
        c = openai.OpenAI(base_url=f"{s.url}/v1", api_key="x", max_retries=0)
        a = c.completions.create(model="m", prompt=system + "Emma", max_tokens=6, temperature=0)
        b = c.completions.create(model="m", prompt=system + "Anne", max_tokens=6, temperature=0)
        assert a.usage is not None
        assert b.usage is not None
        assert a.usage.prompt_tokens_details is not None
        assert b.usage.prompt_tokens_details is not None
        assert a.usage.prompt_tokens_details.cached_tokens == 0
        shared = len(tok.encode(system))
        assert b.usage.prompt_tokens_details.cached_tokens >= shared - 2
        # the cached prefill gives what a cold one gives
        want = expected(reference, system + "Anne", 6, temperature=0)
        assert b.choices[0].text == want.text
        metrics = httpx.get(f"{s.url}/metrics").text
        assert 'rlx_lm_prefills_total{cache="hit"} 1' in metrics


def test_context_limit_ends_with_length(model: tuple[Any, Any]) -> None:
    runner, tok = fresh(model)
    app = create_app(runner, tok, config=ServerConfig(model_name="m", max_context=24))
    prompt_len = len(tok.encode(PROMPT))
    with live_server(app) as s:
        c = openai.OpenAI(base_url=f"{s.url}/v1", api_key="x", max_retries=0)
        r = c.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "a"}], temperature=0
        )
        assert r.choices[0].finish_reason == "length"
        r2 = c.completions.create(model="m", prompt=PROMPT, max_tokens=100, temperature=0)
        assert r2.usage is not None
        assert r2.usage.completion_tokens == 24 - prompt_len
        assert r2.choices[0].finish_reason == "length"


def test_queue_full_is_503_with_retry_after(model: tuple[Any, Any]) -> None:
    runner, tok = fresh(model)
    # 200 steps of 10 ms: the slot is still held when the second request arrives, and the
    # client leaves before the first finishes (the engine alone can finish in between).
    runner = SlowSteps(runner)
    cfg = ServerConfig(model_name="m", max_batch=1, max_queue=0, retry_after=2)
    app = create_app(runner, tok, config=cfg)
    with live_server(app) as s:
        body = {"prompt": PROMPT, "max_tokens": 200, "stream": True, "ignore_eos": True}
        with httpx.stream("POST", f"{s.url}/v1/completions", json=body, timeout=60) as r:
            lines = r.iter_lines()  # kept: a dropped iterator closes the connection
            first = next(lines)  # the slot is taken
            assert first.startswith("data: ")
            busy = httpx.post(
                f"{s.url}/v1/completions", json={"prompt": "x", "max_tokens": 1}, timeout=10
            )
            assert busy.status_code == 503
            assert busy.headers["retry-after"] == "2"
            assert "busy" in busy.json()["error"]["message"]
        # the client went away: the slot frees at the next step
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            ok = httpx.post(
                f"{s.url}/v1/completions", json={"prompt": "x", "max_tokens": 1}, timeout=10
            )
            if ok.status_code == 200:
                break
            time.sleep(0.05)
        assert ok.status_code == 200
        assert 'rlx_lm_finished_total{reason="cancelled"} 1' in httpx.get(f"{s.url}/metrics").text


def test_a_failing_request_fails_alone(model: tuple[Any, Any]) -> None:
    runner, tok = fresh(model)
    poison_prompt = tok.encode("Darcy", add_special_tokens=False)[0]
    poison_token = 7
    faulty = FaultyRunner(runner, poison_prompt, poison_token)
    app = create_app(faulty, tok, config=ServerConfig(model_name="m", max_batch=4))
    with live_server(app) as s:
        c = openai.OpenAI(base_url=f"{s.url}/v1", api_key="x", max_retries=0, timeout=60)
        results: dict[str, Any] = {}

        def healthy() -> None:
            results["ok"] = c.completions.create(
                model="m", prompt=PROMPT, max_tokens=30, temperature=0, logit_bias={"7": -100}
            )

        t = threading.Thread(target=healthy)
        t.start()
        with pytest.raises(openai.InternalServerError) as prefill:
            c.completions.create(model="m", prompt="Darcy", max_tokens=5)
        assert "injected prefill failure" in str(prefill.value)
        # decoding token 7 fails in the middle of a batch: that request alone
        with pytest.raises(openai.InternalServerError) as decode:
            c.completions.create(
                model="m", prompt="She", max_tokens=5, temperature=0, logit_bias={"7": 100}
            )
        assert "injected decode failure" in str(decode.value)
        body = {"prompt": "He", "max_tokens": 5, "logit_bias": {"7": 100}, "stream": True}
        with httpx.stream("POST", f"{s.url}/v1/completions", json=body, timeout=60) as r:
            raw = r.read().decode()
        assert r.status_code == 200
        events = [e for e in raw.split("\n\n") if e]
        assert events[-1] == "data: [DONE]"
        assert "injected decode failure" in json.loads(events[-2][6:])["error"]["message"]
        t.join(60)
        assert results["ok"].choices[0].finish_reason == "length"
        assert results["ok"].usage.completion_tokens == 30
        assert httpx.get(f"{s.url}/health").json() == {"status": "ok"}


def test_graceful_shutdown_finishes_in_flight_requests(model: tuple[Any, Any]) -> None:
    runner, tok = fresh(model)
    # 40 steps of 25 ms: the request is in flight when the poll below sees it and when the
    # server is stopped (the engine alone can finish it between two polls).
    runner = SlowSteps(runner, delay=0.025)
    app = create_app(runner, tok, config=ServerConfig(model_name="m", shutdown_timeout=20))
    server = LiveServer(app).start()
    out: dict[str, Any] = {}

    def long_request() -> None:
        out["r"] = httpx.post(
            f"{server.url}/v1/completions",
            json={"prompt": PROMPT, "max_tokens": 40, "ignore_eos": True},
            timeout=60,
        )

    t = threading.Thread(target=long_request)
    t.start()
    scheduler = app.state.scheduler
    deadline = time.monotonic() + 20
    while scheduler.running == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert scheduler.running == 1
    server.stop()
    t.join(60)
    assert out["r"].status_code == 200
    assert out["r"].json()["usage"]["completion_tokens"] == 40
    assert scheduler.closing
    assert not server.thread.is_alive()


def test_rlx_lm_serve_command_starts_answers_and_stops_on_sigint() -> None:
    import signal
    import socket
    import subprocess
    import sys

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    cmd = [sys.executable, "-m", "rlx_lm.cli", "serve", "--port", str(port), "-c", "256"]
    cmd += ["--model-name", "austen"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
            assert time.monotonic() < deadline
            time.sleep(0.1)
        c = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0)
        assert [m.id for m in c.models.list().data] == ["austen"]
        r = c.completions.create(model="austen", prompt=PROMPT, max_tokens=3)
        assert r.usage is not None
        assert r.usage.completion_tokens == 3
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_non_streaming_client_that_goes_away_frees_its_slot(model: tuple[Any, Any]) -> None:
    runner, tok = fresh(model)
    runner = SlowSteps(runner)  # the engine is fast enough to finish before the client leaves
    app = create_app(runner, tok, config=ServerConfig(model_name="m", max_batch=1))
    scheduler = app.state.scheduler
    with live_server(app) as s:
        body = {"prompt": PROMPT, "max_tokens": 300, "ignore_eos": True}
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{s.url}/v1/completions", json=body, timeout=httpx.Timeout(10, read=1.0))
        deadline = time.monotonic() + 20
        while scheduler.metrics.finished["cancelled"] == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert scheduler.metrics.finished["cancelled"] == 1
        assert scheduler.running == 0
        assert scheduler.metrics.generation_tokens < 300


def test_an_api_key_guards_every_route_but_health_and_metrics(model: tuple[Any, Any]) -> None:
    runner, tok = fresh(model)
    key = "sk-local-0123"
    app = create_app(runner, tok, config=ServerConfig(model_name="austen", api_key=key))
    with live_server(app) as s:
        good = openai.OpenAI(base_url=f"{s.url}/v1", api_key=key, max_retries=0, timeout=60)
        bad = openai.OpenAI(base_url=f"{s.url}/v1", api_key="sk-wrong", max_retries=0, timeout=60)
        with pytest.raises(openai.AuthenticationError) as err:
            bad.completions.create(model="austen", prompt=PROMPT, max_tokens=2)
        assert err.value.code == "invalid_api_key"
        with pytest.raises(openai.AuthenticationError):
            bad.models.list()
        out = good.completions.create(model="austen", prompt=PROMPT, max_tokens=2)
        assert out.choices[0].finish_reason == "length"
        stream = good.chat.completions.create(
            model="austen", messages=[{"role": "user", "content": "Hi"}], max_tokens=2, stream=True
        )
        assert sum(1 for _ in stream) >= 2
        assert [m.id for m in good.models.list()] == ["austen"]
        with httpx.Client(base_url=s.url, timeout=30) as raw:
            r = raw.get("/v1/models")  # no key at all
            assert r.status_code == 401
            assert r.headers["www-authenticate"] == "Bearer"
            assert r.json()["error"]["code"] == "invalid_api_key"
            assert raw.get("/v1/models", headers={"X-Api-Key": key}).status_code == 200
            assert (
                raw.get("/v1/models", headers={"Authorization": f"Basic {key}"}).status_code == 401
            )
            assert raw.get("/health").status_code == 200  # probes need no key
            assert raw.get("/metrics").status_code == 200
            assert raw.post("/tokenize", json={"content": "a"}).status_code == 401
            ok = raw.post("/tokenize", json={"content": "a"}, headers={"X-Api-Key": key})
            assert ok.status_code == 200


@pytest.mark.parametrize("key", ["", "has space", "tab\t", "é-key", 42])
def test_a_bad_api_key_is_refused_by_name(key: Any) -> None:
    with pytest.raises(rlx_lm.InvalidOptionError, match="api_key"):
        ServerConfig(api_key=key)


def test_the_api_key_stays_out_of_the_configs_repr() -> None:
    assert "sk-secret" not in repr(ServerConfig(api_key="sk-secret"))


def test_tokenize_and_detokenize_take_llama_server_and_vllm_shapes(
    server: LiveServer, model: tuple[Any, Any]
) -> None:
    _, tok = model
    text = "It is a truth"
    plain = tok.encode(text, add_special_tokens=False)
    with_bos = tok.encode(text)
    with httpx.Client(base_url=server.url, timeout=30) as raw:
        # llama-server: content, special tokens only with add_special
        r = raw.post("/tokenize", json={"content": text}).json()
        assert r["tokens"] == plain
        assert r["count"] == len(plain)
        assert r["max_model_len"] == MAX_SEQ
        assert (
            raw.post("/tokenize", json={"content": text, "add_special": True}).json()["tokens"]
            == with_bos
        )
        pieces = raw.post("/tokenize", json={"content": text, "with_pieces": True}).json()
        assert [p["id"] for p in pieces["tokens"]] == plain
        assert "".join(p["piece"] for p in pieces["tokens"]) == tok.decode(plain)
        # vLLM: prompt, special tokens unless add_special_tokens is false; token_strs
        r = raw.post("/tokenize", json={"model": "austen", "prompt": text}).json()
        assert r["tokens"] == with_bos
        r = raw.post(
            "/tokenize",
            json={"prompt": text, "add_special_tokens": False, "return_token_strs": True},
        ).json()
        assert r["tokens"] == plain
        assert len(r["token_strs"]) == len(plain)
        # messages: the prompt /v1/chat/completions would prefill
        messages = [{"role": "user", "content": "Hello"}]
        r = raw.post("/tokenize", json={"messages": messages}).json()
        from rlx_lm.server.protocol import render_chat

        assert r["tokens"] == render_chat(tok, messages)
        back = raw.post("/detokenize", json={"tokens": plain}).json()
        assert back == {"content": tok.decode(plain), "prompt": tok.decode(plain)}
        # errors name the field
        for body, param in [
            ({}, "content"),
            ({"content": "a", "prompt": "b"}, "content"),
            ({"content": 5}, "content"),
            ({"content": "a", "add_special": "yes"}, "add_special"),
            ({"content": "a", "bogus": 1}, "bogus"),
            ({"content": "a", "model": "other"}, "model"),
        ]:
            r = raw.post("/tokenize", json=body)
            assert r.status_code in (400, 404), body
            assert r.json()["error"]["param"] == param, body
        for body, param in [
            ({"tokens": [10**9]}, "tokens"),
            ({"tokens": "abc"}, "tokens"),
            ({}, "tokens"),
        ]:
            r = raw.post("/detokenize", json=body)
            assert r.status_code == 400, body
            assert r.json()["error"]["param"] == param, body
        assert raw.post("/tokenize", content=b"{not json").status_code == 400


def test_the_server_answers_reasoning_content_whole_and_streamed(tmp_path: Path) -> None:
    from test_reasoning_chat import THINK, Scripted, _gguf, _ids

    from rlx_lm.tokenizer import Tokenizer

    tok = Tokenizer.load(_gguf(tmp_path, ["<think>", "</think>"], [4, 4], THINK))
    # The template opens the reasoning; the reply closes it and answers, then EOS.
    script = [*_ids(tok, "Two and two.</think>\n\nFour"), *sorted(tok.eos_ids)]
    runner = Scripted(tok.vocab_size, script)
    runner.start = len(tok.apply_chat_template([{"role": "user", "content": "2+2?"}]))
    app = create_app(runner, tok, config=ServerConfig(model_name="thinker", max_batch=2))
    with live_server(app) as server:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)
        msgs: Any = [{"role": "user", "content": "2+2?"}]
        r = client.chat.completions.create(model="thinker", messages=msgs, max_tokens=30)
        m = r.choices[0].message
        assert (m.content, getattr(m, "reasoning_content", None)) == ("Four", "Two and two.")
        assert r.choices[0].finish_reason == "stop"
        reasoning, content = "", ""
        for chunk in client.chat.completions.create(
            model="thinker", messages=msgs, max_tokens=30, stream=True
        ):
            if chunk.choices:
                delta = chunk.choices[0].delta
                reasoning += getattr(delta, "reasoning_content", None) or ""
                content += delta.content or ""
        assert (reasoning, content) == ("Two and two.", "Four")
        # Per request: the reply whole, as the model wrote it.
        raw = httpx.post(
            f"{server.url}/v1/chat/completions",
            json={"messages": msgs, "max_tokens": 30, "reasoning_format": "none"},
            timeout=30,
        ).json()["choices"][0]["message"]
        assert raw == {"role": "assistant", "content": "Two and two.</think>\n\nFour"}
        bad = httpx.post(
            f"{server.url}/v1/chat/completions",
            json={"messages": msgs, "reasoning_format": "sometimes"},
            timeout=30,
        )
        assert bad.status_code == 400
        assert json.loads(bad.text)["error"]["param"] == "reasoning_format"


def _weather_tool() -> Any:
    return [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "The weather in a city",
                "parameters": {
                    "type": "object",
                    "properties": {"city": {"type": "string"}},
                    "required": ["city"],
                },
            },
        }
    ]


def test_the_server_answers_tool_calls_whole_and_streamed(tmp_path: Path) -> None:
    """A Qwen 2.5 model (its own template) that calls a tool: ``message.tool_calls`` and
    ``finish_reason: tool_calls`` through the openai client, whole and streamed; the call sent
    back with its result renders; without ``tools`` the reply is text as written."""
    from test_reasoning_chat import TEMPLATES, Scripted, _gguf, _ids

    from rlx_lm.tokenizer import Tokenizer

    template = (TEMPLATES / "qwen2.5.jinja").read_text(encoding="utf-8")
    added = ["<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>"]
    tok = Tokenizer.load(_gguf(tmp_path, added, [3, 3, 4, 4], template))
    call = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
    reply = f"I will look.<tool_call>\n{call}\n</tool_call>"
    script = [*_ids(tok, reply), tok.inner.token_to_id("<|im_end|>")]
    runner = Scripted(tok.vocab_size, script)
    msgs: Any = [{"role": "user", "content": "Weather in Paris?"}]
    runner.start = len(tok.apply_chat_template(msgs, tools=_weather_tool()))
    app = create_app(runner, tok, config=ServerConfig(model_name="qwen", max_batch=2))
    with live_server(app) as server:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)
        r = client.chat.completions.create(
            model="qwen", messages=msgs, tools=_weather_tool(), max_tokens=200
        )
        m = r.choices[0].message
        assert r.choices[0].finish_reason == "tool_calls"
        assert m.content == "I will look."
        assert m.tool_calls is not None
        assert len(m.tool_calls) == 1
        fn = m.tool_calls[0].function  # type: ignore[union-attr]
        assert (fn.name, json.loads(fn.arguments)) == ("get_weather", {"city": "Paris"})
        assert m.tool_calls[0].id.startswith("call_")
        # Streamed: the text as deltas, the call whole in one delta with its index.
        content, pieces, reasons = "", [], []
        for chunk in client.chat.completions.create(
            model="qwen", messages=msgs, tools=_weather_tool(), max_tokens=200, stream=True
        ):
            if chunk.choices:
                delta = chunk.choices[0].delta
                content += delta.content or ""
                pieces += delta.tool_calls or []
                reasons.append(chunk.choices[0].finish_reason)
        assert content == "I will look."
        assert [(p.index, p.function.name) for p in pieces] == [(0, "get_weather")]  # type: ignore[union-attr]
        assert json.loads(pieces[0].function.arguments) == {"city": "Paris"}  # type: ignore[union-attr, arg-type]
        assert reasons[-1] == "tool_calls"
        # Without tools the reply is not parsed; with tool_choice "none" neither (both
        # prompts leave the tools out).
        runner.start = len(tok.apply_chat_template(msgs))
        for extra in ({}, {"tools": _weather_tool(), "tool_choice": "none"}):
            plain = httpx.post(
                f"{server.url}/v1/chat/completions",
                json={"messages": msgs, "max_tokens": 200, **extra},
                timeout=30,
            ).json()["choices"][0]
            assert plain["message"] == {"role": "assistant", "content": reply}, extra
            assert plain["finish_reason"] == "stop"
        # The call and its result sent back: the template renders them.
        back = [
            *msgs,
            m.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": m.tool_calls[0].id, "content": "18 C"},
        ]
        again = client.chat.completions.create(
            model="qwen", messages=back, tools=_weather_tool(), max_tokens=5
        )
        assert again.choices[0].finish_reason in ("length", "stop", "tool_calls")
        forced = httpx.post(
            f"{server.url}/v1/chat/completions",
            json={"messages": msgs, "tools": _weather_tool(), "tool_choice": "required"},
            timeout=30,
        )
        assert forced.status_code == 400
        assert forced.json()["error"]["param"] == "tool_choice"


def test_the_server_answers_gpt_oss_calls_beside_its_reasoning(tmp_path: Path) -> None:
    """gpt-oss's harmony reply (its own template): the analysis channel is reasoning, the
    message to ``functions.get_weather`` is the call, and ``<|call|>`` ends the turn."""
    from test_reasoning_chat import HARMONY, TEMPLATES, Scripted, _gguf, _ids

    from rlx_lm.tokenizer import Tokenizer

    template = (TEMPLATES / "gpt-oss.jinja").read_text(encoding="utf-8")
    tok = Tokenizer.load(_gguf(tmp_path, HARMONY, [3] * len(HARMONY), template))
    reply = (
        "<|channel|>analysis<|message|>Need the weather tool.<|end|>"
        "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
        '<|message|>{"city":"Paris"}<|call|>'
    )
    runner = Scripted(tok.vocab_size, _ids(tok, reply))
    msgs: Any = [{"role": "user", "content": "Weather in Paris?"}]
    runner.start = len(tok.apply_chat_template(msgs, tools=_weather_tool()))
    app = create_app(runner, tok, config=ServerConfig(model_name="oss", max_batch=2))
    with live_server(app) as server:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)
        body = httpx.post(
            f"{server.url}/v1/chat/completions",
            json={"messages": msgs, "tools": _weather_tool(), "max_tokens": 300},
            timeout=30,
        ).json()
        choice = body["choices"][0]
        message = choice["message"]
        assert choice["finish_reason"] == "tool_calls"
        assert message["reasoning_content"] == "Need the weather tool."
        assert message["content"] is None
        assert [
            (c["function"]["name"], json.loads(c["function"]["arguments"]))
            for c in message["tool_calls"]
        ] == [("get_weather", {"city": "Paris"})]
        reasoning, names, reasons = "", [], []
        for chunk in client.chat.completions.create(
            model="oss", messages=msgs, tools=_weather_tool(), max_tokens=300, stream=True
        ):
            if chunk.choices:
                delta = chunk.choices[0].delta
                reasoning += getattr(delta, "reasoning_content", None) or ""
                assert not delta.content
                names += [t.function.name for t in delta.tool_calls or []]  # type: ignore[union-attr]
                reasons.append(chunk.choices[0].finish_reason)
        assert (reasoning, names, reasons[-1]) == (
            "Need the weather tool.",
            ["get_weather"],
            "tool_calls",
        )
