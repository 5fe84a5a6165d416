"""The clauses of the runner contract, each a named check with a one-line summary.

A clause returns a note when it passes (for example that it ran through `HostDriven`),
raises `ClauseSkip` when the runner does not claim the capability, and `ClauseFailure`
with what was expected and what came back when the runner breaks it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rlx_lm._core import argmax
from rlx_lm.session import ModelFingerprint, SessionSnapshot
from rlx_lm.testing.capabilities import MEMBERS, SAME_OBJECT, as_vocab_size, member_problems
from rlx_lm.testing.checks import (
    ClauseContext,
    ClauseFailure,
    ClauseSkip,
    as_row,
    as_tokens,
    assert_close,
    call,
    show_tokens,
)
from rlx_lm.testing.report import format_error

__all__ = [
    "CLAUSES",
    "Clause",
    "clause_names",
]


@dataclass(frozen=True)
class Clause:
    """A named rule of the runner contract and the check that tests it."""

    name: str
    summary: str
    check: Callable[[ClauseContext], str | None]
    needs_core: bool = True
    uses: tuple[str, ...] = ()


def _structure_members(ctx: ClauseContext) -> str | None:
    runner = ctx.fresh()
    if ctx.fresh() is runner:
        raise ClauseFailure(SAME_OBJECT)
    problems, _ = member_problems(runner)
    if problems:
        raise ClauseFailure("; ".join(problems))
    present = [
        m.name for m in MEMBERS if not m.required and callable(getattr(runner, m.name, None))
    ]
    return f"optional members: {', '.join(present) or 'none'}"


def _structure_family(ctx: ClauseContext) -> str | None:
    runner = ctx.fresh()
    family = call("reading family", lambda: runner.family)
    if callable(family):
        raise ClauseFailure(
            f"family is a method ({family!r}); expected a str attribute or property"
        )
    if not isinstance(family, str):
        raise ClauseFailure(
            f"family is {type(family).__name__} {family!r}; expected a non-empty str"
        )
    if not family.strip():
        raise ClauseFailure(f"family is {family!r}; expected a non-empty str")
    return None


def _structure_vocab_size(ctx: ClauseContext) -> str | None:
    runner = ctx.fresh()
    vocab = call("reading vocab_size", lambda: runner.vocab_size)
    if callable(vocab):
        raise ClauseFailure(
            f"vocab_size is a method ({vocab!r}); expected an int attribute or property"
        )
    if as_vocab_size(vocab) is None:
        raise ClauseFailure(
            f"vocab_size is {type(vocab).__name__} {vocab!r}; expected a positive int"
        )
    return None


def _logits_row(ctx: ClauseContext) -> str | None:
    from hypothesis import strategies as st

    vocab = ctx.vocab
    f32_max = float(np.finfo(np.float32).max)

    def body(ex: dict[str, Any]) -> None:
        prompt = ex["prompt"]
        what = f"predict_logits({show_tokens(prompt)})"
        out = call(what, ctx.fresh().predict_logits, list(prompt))
        if isinstance(out, np.ndarray) and out.dtype != np.float32:
            raise ClauseFailure(
                f"{what} returned a numpy array of dtype {out.dtype}; expected float32"
            )
        row = as_row(out, what)
        if row.size != vocab:
            raise ClauseFailure(f"{what} returned {row.size} values; expected vocab_size={vocab}")
        bad = np.flatnonzero(~np.isfinite(row) | (np.abs(row) > f32_max))
        if bad.size:
            raise ClauseFailure(
                f"{what} has {bad.size} value(s) that are not finite float32, first at index "
                f"{int(bad[0])}: {float(row[bad[0]])}; expected {vocab} finite float32 values"
            )

    ctx.for_all(st.fixed_dictionaries({"prompt": ctx.prompts()}), body)
    return None


def _logits_deterministic(ctx: ClauseContext) -> str | None:
    from hypothesis import strategies as st

    def body(ex: dict[str, Any]) -> None:
        prompt, other = ex["prompt"], ex["other"]
        runner = ctx.fresh()
        what = f"predict_logits({show_tokens(prompt)})"
        first_out = call(what, runner.predict_logits, list(prompt))
        first = as_row(first_out, what)
        call(f"predict_logits({show_tokens(other)})", runner.predict_logits, list(other))
        assert_close(
            as_row(first_out, what),
            first,
            f"the row {what} returned, read again after predict_logits({show_tokens(other)}),",
            "its value when returned (the runner hands out a buffer it later overwrites)",
            ctx.opts,
        )
        again = as_row(call(what, runner.predict_logits, list(prompt)), what)
        assert_close(again, first, f"a second {what}", "the first", ctx.opts)

    ctx.for_all(st.fixed_dictionaries({"prompt": ctx.prompts(), "other": ctx.prompts()}), body)
    return None


def _greedy_note(ctx: ClauseContext) -> str | None:
    if ctx.caps.own_generate:
        return None
    return "via rlx_lm.with_defaults: the runner has no generate of its own"


def _greedy_stop(ctx: ClauseContext) -> str | None:
    from hypothesis import strategies as st

    @st.composite
    def examples(draw: st.DrawFn) -> dict[str, Any]:
        n_new = draw(st.integers(1, ctx.opts.max_new_tokens))
        return {
            "prompt": draw(ctx.prompts()),
            "n_new": n_new,
            "stop_after": draw(st.integers(1, n_new)),
        }

    def body(ex: dict[str, Any]) -> None:
        prompt, n_new = ex["prompt"], ex["n_new"]
        stop_after: int = ex["stop_after"]
        seen: list[int] = []

        def on_token(token: int) -> bool:
            seen.append(int(token))
            return len(seen) < stop_after

        what = f"generate({show_tokens(prompt)}, {n_new}, on_token)"
        gen = ctx.generator(ctx.fresh())
        out = as_tokens(call(what, gen.generate, list(prompt), n_new, on_token), what, ctx.vocab)
        if len(seen) != stop_after:
            raise ClauseFailure(
                f"{what} called on_token {len(seen)} time(s) ({seen}); on_token returned "
                f"False on call {stop_after}, so generation should have stopped there"
            )
        if out != seen:
            raise ClauseFailure(
                f"{what} returned {out}, but on_token saw {seen} and returned False on the "
                f"last one; expected {seen}: the stopping token is kept"
            )

    ctx.for_all(examples(), body)
    return _greedy_note(ctx)


def _greedy_argmax(ctx: ClauseContext) -> str | None:
    from hypothesis import strategies as st

    opts = ctx.opts

    def body(ex: dict[str, Any]) -> None:
        prompt, n_new = ex["prompt"], ex["n_new"]
        seen: list[int] = []

        def on_token(token: int) -> bool:
            seen.append(int(token))
            return True

        what = f"generate({show_tokens(prompt)}, {n_new}, on_token)"
        gen = ctx.generator(ctx.fresh())
        out = as_tokens(call(what, gen.generate, list(prompt), n_new, on_token), what, ctx.vocab)
        if len(out) != n_new:
            raise ClauseFailure(
                f"{what} returned {len(out)} tokens {out}; expected {n_new}, as on_token "
                f"never asked it to stop"
            )
        if seen != out:
            raise ClauseFailure(f"{what} returned {out} but on_token saw {seen}; expected the same")
        ref = ctx.fresh()
        context = list(prompt)
        for step, token in enumerate(out):
            p_what = f"predict_logits({show_tokens(context)})"
            row = as_row(call(p_what, ref.predict_logits, list(context)), p_what)
            best = call(f"rlx_lm.argmax({p_what})", argmax, row.astype(np.float32))
            margin = opts.atol + opts.rtol * abs(row[best])
            if token != best and not row[token] >= row[best] - margin:
                raise ClauseFailure(
                    f"{what} returned {out}; step {step} chose {token} (logit "
                    f"{row[token]:.7g}) but the argmax of {p_what} is {best} (logit "
                    f"{row[best]:.7g}): expected the argmax loop's tokens "
                    f"(ties within atol/rtol are accepted)"
                )
            context.append(token)

    examples = st.fixed_dictionaries(
        {"prompt": ctx.prompts(), "n_new": st.integers(0, opts.max_new_tokens)}
    )
    ctx.for_all(examples, body)
    return _greedy_note(ctx)


def _pair_note(ctx: ClauseContext) -> str | None:
    if ctx.caps.own_pair:
        return None
    return f"via rlx_lm.HostDriven: {ctx.caps.pair_note}"


def _host_prefill(ctx: ClauseContext) -> str | None:
    from hypothesis import strategies as st

    def body(ex: dict[str, Any]) -> None:
        prompt, previous = ex["prompt"], ex["previous"]
        pair = ctx.pair(ctx.fresh())
        if previous:
            call(f"prefill_logits({show_tokens(previous)})", pair.prefill_logits, list(previous))
        what = f"prefill_logits({show_tokens(prompt)})"
        if previous:
            what += f" following prefill_logits({show_tokens(previous)})"
        got = as_row(call(what, pair.prefill_logits, list(prompt)), what)
        want_what = f"predict_logits({show_tokens(prompt)})"
        want = as_row(call(want_what, ctx.fresh().predict_logits, list(prompt)), want_what)
        assert_close(got, want, what, want_what, ctx.opts)

    examples = st.fixed_dictionaries(
        {"prompt": ctx.prompts(), "previous": ctx.tokens(0, ctx.opts.max_prompt_len)}
    )
    ctx.for_all(examples, body)
    return _pair_note(ctx)


def _host_decode(ctx: ClauseContext) -> str | None:
    from hypothesis import strategies as st

    def body(ex: dict[str, Any]) -> None:
        prompt, continuation = ex["prompt"], ex["continuation"]
        pair = ctx.pair(ctx.fresh())
        ref = ctx.fresh()
        call(f"prefill_logits({show_tokens(prompt)})", pair.prefill_logits, list(prompt))
        context = list(prompt)
        for i, token in enumerate(continuation):
            what = f"decode_logits({token}) after prefill_logits({show_tokens(prompt)})"
            if i:
                what += f" and decoding {show_tokens(continuation[:i])}"
            got = as_row(call(what, pair.decode_logits, token), what)
            context.append(token)
            want_what = f"predict_logits({show_tokens(context)})"
            want = as_row(call(want_what, ref.predict_logits, list(context)), want_what)
            assert_close(got, want, what, want_what, ctx.opts)

    examples = st.fixed_dictionaries(
        {"prompt": ctx.prompts(), "continuation": ctx.tokens(1, ctx.opts.max_new_tokens)}
    )
    ctx.for_all(examples, body)
    return _pair_note(ctx)


def _host_decode_before_prefill(ctx: ClauseContext) -> str | None:
    pair = ctx.pair(ctx.fresh())
    try:
        out = pair.decode_logits(0)
    except Exception as exc:
        note = f"raised {type(exc).__name__}"
        extra = _pair_note(ctx)
        return f"{note}; {extra}" if extra else note
    raise ClauseFailure(
        f"decode_logits(0) on a fresh runner returned {type(out).__name__} instead of raising; "
        f"expected an error (such as rlx_lm.SequenceStateError): there is no sequence to continue"
    )


def _need_sessions(ctx: ClauseContext) -> None:
    if ctx.caps.sessions is not None:
        raise ClauseSkip(f"the runner does not claim sessions: {ctx.caps.sessions}")
    if not ctx.caps.own_pair:
        raise ClauseFailure(
            "the runner exports sessions but has no working prefill_logits/decode_logits pair "
            f"({ctx.caps.pair_note}); a restored session cannot be continued without one"
        )


def _export(runner: Any, what: str) -> SessionSnapshot:
    snap = call(f"export_session() {what}", runner.export_session)
    if not isinstance(snap, SessionSnapshot):
        raise ClauseFailure(
            f"export_session() {what} returned {type(snap).__name__} {snap!r}; expected an "
            f"rlx_lm.SessionSnapshot"
        )
    return snap


def _restore(runner: Any, snap: SessionSnapshot, what: str) -> None:
    applied = call(f"restore_session({what})", runner.restore_session, snap)
    if applied is not True:
        raise ClauseFailure(f"restore_session({what}) returned {applied!r}; expected True")


def _sessions_roundtrip(ctx: ClauseContext) -> str | None:
    from hypothesis import strategies as st

    _need_sessions(ctx)
    n = ctx.opts.max_new_tokens

    def decode_all(runner: Any, tokens: Sequence[int], what: str) -> list[Any]:
        return [
            as_row(call(f"{what}: decode_logits({t})", runner.decode_logits, t), what)
            for t in tokens
        ]

    def body(ex: dict[str, Any]) -> None:
        prompt, before, after = ex["prompt"], ex["before"], ex["after"]
        start = f"prefill_logits({show_tokens(prompt)})" + (
            f" and decoding {show_tokens(before)}" if before else ""
        )
        reference = ctx.fresh()
        call(start, reference.prefill_logits, list(prompt))
        decode_all(reference, before, "uninterrupted run")
        want = decode_all(reference, after, "uninterrupted run")

        live = ctx.fresh()
        call(start, live.prefill_logits, list(prompt))
        decode_all(live, before, start)
        snap = _export(live, f"after {start}")
        if list(snap.tokens) != [*prompt, *before]:
            raise ClauseFailure(
                f"export_session() after {start} has tokens {list(snap.tokens)}; "
                f"expected {[*prompt, *before]}"
            )
        cont = f"decoding {show_tokens(after)}"

        def compare(got: list[Any], how: str) -> None:
            for t, g, w in zip(after, got, want, strict=True):
                assert_close(
                    g,
                    w,
                    f"decode_logits({t}) {how}",
                    "the same step of an uninterrupted run",
                    ctx.opts,
                )

        compare(decode_all(live, after, "live"), f"after export_session() and {cont}")
        for attempt in ("first", "second"):
            _restore(live, snap, f"its own snapshot, {attempt} time")
            compare(
                decode_all(live, after, "restored"),
                f"after {start}, exporting, {cont}, restoring the snapshot ({attempt} time) "
                f"and {cont} again",
            )
        other = ctx.fresh()
        _restore(other, snap, "a snapshot from another instance")
        compare(
            decode_all(other, after, "restored into a fresh runner"),
            f"in a fresh runner restored from the snapshot of {start}",
        )

    examples = st.fixed_dictionaries(
        {"prompt": ctx.prompts(), "before": ctx.tokens(0, n), "after": ctx.tokens(1, n)}
    )
    ctx.for_all(examples, body)
    return None


def _sessions_reuse(ctx: ClauseContext) -> str | None:
    from hypothesis import strategies as st

    _need_sessions(ctx)

    @st.composite
    def examples(draw: st.DrawFn) -> dict[str, Any]:
        prompt = draw(ctx.tokens(2, ctx.opts.max_prompt_len))
        return {
            "prompt": prompt,
            "cached": draw(st.integers(1, len(prompt) - 1)),
            "tail": draw(ctx.tokens(0, 3)),
            "next": draw(st.integers(0, ctx.vocab - 1)),
        }

    def body(ex: dict[str, Any]) -> None:
        prompt, cached, tail, nxt = ex["prompt"], ex["cached"], ex["tail"], ex["next"]
        full = f"prefill_logits({show_tokens(prompt)})"
        reference = ctx.fresh()
        want = as_row(call(full, reference.prefill_logits, list(prompt)), full)
        want_next = as_row(
            call(f"decode_logits({nxt}) after {full}", reference.decode_logits, nxt), full
        )
        seq = [*prompt[:cached], *tail]
        runner = ctx.fresh()
        call(f"prefill_logits({show_tokens(seq)})", runner.prefill_logits, seq)
        snap = _export(runner, f"after prefill_logits({show_tokens(seq)})")
        for reuse in range(cached + 1):
            what = (
                f"prefill_logits_reusing({show_tokens(prompt)}, snapshot of {show_tokens(seq)}, "
                f"reuse_len={reuse})"
            )
            got = as_row(call(what, runner.prefill_logits_reusing, list(prompt), snap, reuse), what)
            assert_close(got, want, what, full, ctx.opts)
            after = f"decode_logits({nxt}) after {what}"
            got_next = as_row(call(after, runner.decode_logits, nxt), after)
            assert_close(got_next, want_next, after, f"decode_logits({nxt}) after {full}", ctx.opts)

    ctx.for_all(examples(), body)
    return None


def _foreign_fingerprints(own: ModelFingerprint | None, family: str) -> list[ModelFingerprint]:
    if own is None:
        return [ModelFingerprint(f"{family}-foreign", (0,), "rlx-conformance-foreign")]
    return [
        ModelFingerprint(f"{own.family}-foreign", own.geometry, own.model_id),
        ModelFingerprint(own.family, (*own.geometry, 1), own.model_id),
    ]


def _sessions_foreign(ctx: ClauseContext) -> str | None:
    from hypothesis import strategies as st

    _need_sessions(ctx)
    probe = ctx.fresh()
    call("prefill_logits([0])", probe.prefill_logits, [0])
    if _export(probe, "after prefill_logits([0])").fingerprint is None:
        raise ClauseSkip(
            "not applicable: the runner does not fingerprint its sessions (export_session() "
            "gave fingerprint None), so no snapshot is foreign to it; give its SessionSnapshot "
            "a ModelFingerprint to have this clause checked"
        )

    def body(ex: dict[str, Any]) -> None:
        prompt, moved, nxt = ex["prompt"], ex["moved"], ex["next"]
        # The live session moves on after the export, so a restore that overwrote it
        # before refusing would be seen in the last decode.
        start = f"prefill_logits({show_tokens(prompt)})"
        live = f"{start}, export_session(), decode_logits({moved})"
        reference = ctx.fresh()
        call(start, reference.prefill_logits, list(prompt))
        call(f"decode_logits({moved})", reference.decode_logits, moved)
        want = as_row(call(f"decode_logits({nxt})", reference.decode_logits, nxt), start)

        runner = ctx.fresh()
        call(start, runner.prefill_logits, list(prompt))
        own = _export(runner, f"after {start}")
        call(f"decode_logits({moved}) after {start}", runner.decode_logits, moved)
        for fp in _foreign_fingerprints(own.fingerprint, ctx.caps.family):
            foreign = SessionSnapshot(own.kv, own.tokens, fp)
            what = f"restore_session(a snapshot with fingerprint {fp})"
            try:
                applied = runner.restore_session(foreign)
            except ValueError:
                continue
            except Exception as exc:
                raise ClauseFailure(
                    f"{what} raised {format_error(exc)}; expected a ValueError such as "
                    f"rlx_lm.SnapshotMismatchError"
                ) from exc
            raise ClauseFailure(
                f"{what} returned {applied!r} (runner's own fingerprint: {own.fingerprint}); "
                f"expected rlx_lm.SnapshotMismatchError"
            )
        after = f"decode_logits({nxt}) after {live} and the refused foreign restores"
        got = as_row(call(after, runner.decode_logits, nxt), after)
        assert_close(
            got,
            want,
            after,
            f"decode_logits({nxt}) after {start}, decode_logits({moved}) (the session as it was)",
            ctx.opts,
        )

    token = st.integers(0, ctx.vocab - 1)
    examples = st.fixed_dictionaries({"prompt": ctx.prompts(), "moved": token, "next": token})
    ctx.for_all(examples, body)
    return None


def _batched_decode(ctx: ClauseContext) -> str | None:
    """decode_batch (the runner's own, else the adapter's loop) equals one by one."""
    from hypothesis import strategies as st

    from rlx_lm.runner import supports_batched_decode, with_defaults

    own = supports_batched_decode(ctx.fresh())
    # Sessions only when the runner has them and its pair works; else token-only sessions.
    sessions = ctx.caps.sessions is None and ctx.caps.own_pair

    def body(ex: dict[str, Any]) -> None:
        prompts, nexts = ex["prompts"], ex["next"][: len(ex["prompts"])]
        runner = ctx.fresh()
        snaps: list[SessionSnapshot] = []
        for p in prompts:
            if sessions:
                call(f"prefill_logits({show_tokens(p)})", runner.prefill_logits, list(p))
                snaps.append(_export(runner, f"after prefill_logits({show_tokens(p)})"))
            else:
                snaps.append(SessionSnapshot(None, p))
        what = f"decode_batch(sessions of {[show_tokens(p) for p in prompts]}, {nexts})"
        batched = runner.decode_batch if own else with_defaults(runner).decode_batch
        logits, advanced = call(what, batched, snaps, list(nexts))
        rows = np.asarray(logits)
        if rows.ndim != 2 or rows.shape[0] != len(prompts) or len(advanced) != len(prompts):
            raise ClauseFailure(
                f"{what} returned logits of shape {rows.shape} and {len(advanced)} sessions; "
                f"expected {len(prompts)} rows and sessions"
            )
        one = ctx.fresh()
        for i, (p, t) in enumerate(zip(prompts, nexts, strict=True)):
            if sessions:
                _restore(one, snaps[i], f"snapshot of {show_tokens(p)}")
                want_what = f"decode_logits({t}) after restoring {show_tokens(p)}"
                want = as_row(call(want_what, one.decode_logits, t), want_what)
            else:
                want_what = f"predict_logits({show_tokens([*p, t])})"
                want = as_row(call(want_what, one.predict_logits, [*p, t]), want_what)
            assert_close(
                as_row(rows[i], f"row {i}"), want, f"row {i} of {what}", want_what, ctx.opts
            )
            if tuple(advanced[i].tokens) != (*p, t):
                raise ClauseFailure(
                    f"{what}: session {i} holds {show_tokens(advanced[i].tokens)} afterwards, "
                    f"expected {show_tokens([*p, t])}"
                )

    examples = st.fixed_dictionaries(
        {
            "prompts": st.lists(ctx.prompts(), min_size=1, max_size=4),
            "next": ctx.tokens(4, 4),
        }
    )
    if own:
        ctx.for_all(examples, body)
        return None
    try:
        ctx.for_all(examples, body)
    except ClauseFailure as exc:
        # The adapter's loop is the runner's own one-by-one path: a mismatch here is a defect
        # of the methods it calls, which their own clauses report.
        raise ClauseSkip(
            "the runner has no decode_batch, and RunnerAdapter's loop over its own methods "
            f"did not hold (see the other clauses): {exc.message}"
        ) from exc
    return "via RunnerAdapter.decode_batch (one sequence at a time)"


def _multimodal_phases(ctx: ClauseContext) -> str | None:
    if ctx.caps.multimodal is not None:
        raise ClauseSkip(f"the runner does not claim multimodal generation: {ctx.caps.multimodal}")
    w, h = ctx.opts.image_size
    rgb = bytes(i % 251 for i in range(w * h * 3))
    runner = ctx.fresh()
    phases: list[str] = []
    call("set_multimodal_phase_callback(cb)", runner.set_multimodal_phase_callback, phases.append)
    what = f"generate_multimodal({ctx.opts.multimodal_prompt!r}, <{w}x{h} RGB>, {w}, {h}, None, 1)"
    out = call(
        what,
        runner.generate_multimodal,
        ctx.opts.multimodal_prompt,
        rgb,
        w,
        h,
        None,
        1,
        lambda _t: True,
    )
    as_tokens(out, what, ctx.vocab)
    if "vision" not in phases or "prefill" not in phases:
        raise ClauseFailure(
            f"{what} fired the phase callback with {phases}; expected 'vision' then 'prefill'"
        )
    if phases.index("vision") > phases.index("prefill") or phases[0] != "vision":
        raise ClauseFailure(
            f"{what} fired the phase callback with {phases}; expected 'vision' first, then "
            f"'prefill'"
        )
    fired = len(phases)
    call("set_multimodal_phase_callback(None)", runner.set_multimodal_phase_callback, None)
    call(what, runner.generate_multimodal, ctx.opts.multimodal_prompt, rgb, w, h, None, 1, None)
    if len(phases) != fired:
        raise ClauseFailure(
            f"after set_multimodal_phase_callback(None), {what} still fired the old callback "
            f"with {phases[fired:]}; expected None to clear it"
        )
    return None


CLAUSES: tuple[Clause, ...] = (
    Clause(
        "structure.members",
        "the members exist with signatures the protocols can call",
        _structure_members,
        needs_core=False,
    ),
    Clause("structure.family", "family is a non-empty str", _structure_family, needs_core=False),
    Clause(
        "structure.vocab_size",
        "vocab_size is a positive int",
        _structure_vocab_size,
        needs_core=False,
    ),
    Clause(
        "logits.row",
        "predict_logits returns vocab_size finite float32 values",
        _logits_row,
        uses=("predict_logits",),
    ),
    Clause(
        "logits.deterministic",
        "predict_logits returns the same values for the same prompt, in a row that stays put",
        _logits_deterministic,
        uses=("predict_logits",),
    ),
    Clause(
        "greedy.stop",
        "generate stops when on_token returns False and keeps that token",
        _greedy_stop,
        uses=("predict_logits", "generate"),
    ),
    Clause(
        "greedy.argmax",
        "generate equals the argmax loop over predict_logits",
        _greedy_argmax,
        uses=("predict_logits", "generate"),
    ),
    Clause(
        "host_driven.prefill",
        "prefill_logits equals predict_logits on the same prompt",
        _host_prefill,
        uses=("predict_logits", "prefill_logits", "decode_logits"),
    ),
    Clause(
        "host_driven.decode",
        "decode_logits(t) equals predict_logits(context + [t])",
        _host_decode,
        uses=("predict_logits", "prefill_logits", "decode_logits"),
    ),
    Clause(
        "host_driven.decode_before_prefill",
        "decode_logits before any prefill_logits raises",
        _host_decode_before_prefill,
        uses=("predict_logits", "prefill_logits", "decode_logits"),
    ),
    Clause(
        "sessions.roundtrip",
        "export -> restore -> decode equals an uninterrupted run, in the same or a fresh runner",
        _sessions_roundtrip,
        uses=("prefill_logits", "decode_logits", "export_session", "restore_session"),
    ),
    Clause(
        "sessions.reuse",
        "prefill_logits_reusing equals a full prefill for every reuse_len",
        _sessions_reuse,
        uses=("prefill_logits", "decode_logits", "export_session", "prefill_logits_reusing"),
    ),
    Clause(
        "sessions.foreign",
        "restoring a foreign snapshot raises and leaves the session as it was",
        _sessions_foreign,
        uses=("prefill_logits", "decode_logits", "export_session", "restore_session"),
    ),
    Clause(
        "batched.decode",
        "decode_batch row i equals decoding sessions[i] alone (the adapter's loop without it)",
        _batched_decode,
        uses=("predict_logits",),
    ),
    Clause(
        "multimodal.phases",
        "the phase callback fires 'vision' then 'prefill', and None clears it",
        _multimodal_phases,
        uses=("set_multimodal_phase_callback", "generate_multimodal"),
    ),
)


def clause_names() -> list[str]:
    """Names of every clause, in the order they run."""
    return [c.name for c in CLAUSES]
