"""The conformance clauses a runner must keep, and `check_runner`, which runs them.

The kit works on any object: a third-party runner need not import rlx_lm. Members are
found by attribute probes and checked with `inspect.signature`; capabilities (a cached
prefill/decode pair, sessions, multimodal generation) are tested when the runner has
them, and the defaults rlx_lm supplies (`with_defaults`, `HostDriven`) are tested when
it does not. Prompts and continuations are drawn by hypothesis from the runner's
vocabulary; a failure is shrunk to a minimal example, which the report prints.

Every example builds its runners afresh from the factory, so examples are independent
and a printed example reproduces on its own. A factory should therefore be cheap: load
weights once at module level and build the runner around them.
"""

from __future__ import annotations

import importlib
import inspect
import math
import operator
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from rlx_lm._core import argmax
from rlx_lm.errors import InvalidOptionError
from rlx_lm.host_driven import HostDriven
from rlx_lm.runner import (
    LmCore,
    LmRunner,
    SupportsHostDriven,
    SupportsKvStats,
    SupportsMultimodal,
    SupportsPromptCache,
    supports_generate,
    supports_host_driven,
    supports_multimodal,
    supports_prompt_cache,
    with_defaults,
)
from rlx_lm.session import ModelFingerprint, SessionSnapshot
from rlx_lm.testing.report import ClauseResult, Report

if TYPE_CHECKING:
    from hypothesis.strategies import SearchStrategy

__all__ = [
    "CLAUSES",
    "DEFAULT_ATOL",
    "DEFAULT_MAX_EXAMPLES",
    "DEFAULT_MAX_NEW_TOKENS",
    "DEFAULT_MAX_PROMPT_LEN",
    "DEFAULT_RTOL",
    "CheckOptions",
    "Clause",
    "Factory",
    "check_runner",
    "clause_names",
    "require_hypothesis",
    "run_clause",
]

Factory = Callable[[], object]
"""Builds a fresh runner; called several times per clause, so it should be cheap."""

DEFAULT_ATOL = 1e-4
"""Absolute tolerance when two logits rows must agree: ``|got - want| <= atol + rtol * |want|``."""
DEFAULT_RTOL = 1e-4
"""Relative tolerance when two logits rows must agree (see `DEFAULT_ATOL`)."""
DEFAULT_MAX_EXAMPLES = 20
"""Hypothesis examples per clause."""
DEFAULT_MAX_PROMPT_LEN = 8
"""Longest prompt drawn, in tokens."""
DEFAULT_MAX_NEW_TOKENS = 4
"""Most tokens generated or decoded per example."""


def require_hypothesis() -> None:
    """Raise a clear ImportError when hypothesis, which draws the prompts, is not installed."""
    try:
        importlib.import_module("hypothesis")
    except ImportError as exc:
        raise ImportError(
            "rlx_lm.testing draws prompts with hypothesis, which is not installed; "
            "install it with: pip install 'rlx-lm[testing]'"
        ) from exc


@dataclass(frozen=True)
class CheckOptions:
    """Tolerances and search budget of a conformance run (defaults: the ``DEFAULT_*`` constants)."""

    atol: float = DEFAULT_ATOL
    rtol: float = DEFAULT_RTOL
    max_examples: int = DEFAULT_MAX_EXAMPLES
    max_prompt_len: int = DEFAULT_MAX_PROMPT_LEN
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    seed: int | None = 0
    image_size: tuple[int, int] = (8, 8)
    multimodal_prompt: str = "<image>\nDescribe the image."

    def __post_init__(self) -> None:
        for name in ("atol", "rtol"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise InvalidOptionError(f"{name} must be a finite number >= 0, got {value!r}")
        for name, low in (("max_examples", 1), ("max_prompt_len", 2), ("max_new_tokens", 1)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise InvalidOptionError(f"{name} must be an int >= {low}, got {value!r}")
        w, h = self.image_size
        if w < 1 or h < 1:
            raise InvalidOptionError(f"image_size must be positive, got {self.image_size!r}")


# -- failure plumbing ---------------------------------------------------------------


class _Fail(Exception):
    def __init__(self, message: str, example: Mapping[str, object] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.example = example


class _Skip(Exception):
    pass


def _exc(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _call(what: str, fn: Callable[..., Any], *args: Any) -> Any:
    """Call a runner member; any exception becomes a failure that names the call."""
    try:
        return fn(*args)
    except Exception as exc:
        raise _Fail(f"{what} raised {_exc(exc)}") from exc


def _show(tokens: Sequence[int]) -> str:
    return repr(list(tokens))


# -- the protocol's members, read from rlx_lm.runner --------------------------------


@dataclass(frozen=True)
class _Member:
    name: str
    protocol: str
    required: bool
    is_property: bool
    params: tuple[str, ...] = ()
    n_required: int = 0


def _protocol_members() -> tuple[_Member, ...]:
    groups: list[tuple[type, bool]] = [
        (LmCore, True),
        (LmRunner, False),
        (SupportsHostDriven, False),
        (SupportsPromptCache, False),
        (SupportsKvStats, False),
        (SupportsMultimodal, False),
    ]
    members: list[_Member] = []
    for proto, required in groups:
        for name, value in vars(proto).items():
            if name.startswith("_"):
                continue
            if isinstance(value, property):
                members.append(_Member(name, proto.__name__, required, is_property=True))
            elif inspect.isfunction(value):
                params = list(inspect.signature(value).parameters.values())[1:]
                members.append(
                    _Member(
                        name,
                        proto.__name__,
                        required,
                        is_property=False,
                        params=tuple(p.name for p in params),
                        n_required=sum(p.default is inspect.Parameter.empty for p in params),
                    )
                )
    return tuple(members)


MEMBERS = _protocol_members()
_PAIRED = (("prefill_logits", "decode_logits"), ("export_session", "restore_session"))


def _signature_problem(obj: object, member: _Member) -> str | None:
    """Why ``obj.<member>`` cannot be called the way the protocol calls it, or None."""
    fn = getattr(obj, member.name)
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return None  # not introspectable (some builtins): give it the benefit of the doubt
    for n in sorted({member.n_required, len(member.params)}):
        try:
            sig.bind(*range(n))
        except TypeError as exc:
            call = f"{member.name}({', '.join(member.params[:n])})"
            return (
                f"{member.name}{sig} cannot be called as {call} "
                f"(the {member.protocol} protocol passes these positionally): {exc}"
            )
    return None


def _member_problems(obj: object) -> tuple[list[str], dict[str, str]]:
    """Problems with the members, and which present methods have unusable signatures."""
    problems: list[str] = []
    bad: dict[str, str] = {}
    for m in MEMBERS:
        try:
            present = hasattr(obj, m.name)
        except Exception as exc:  # a property that raises
            problems.append(f"reading {m.name} raised {_exc(exc)}")
            continue
        if not present:
            if m.required:
                kind = "property" if m.is_property else f"method {m.name}({', '.join(m.params)})"
                problems.append(f"missing required {kind} ({m.protocol})")
            continue
        if m.is_property:
            continue
        value = getattr(obj, m.name)
        if not callable(value):
            problems.append(f"{m.name} is a {type(value).__name__}, not a method")
            bad[m.name] = problems[-1]
            continue
        problem = _signature_problem(obj, m)
        if problem is not None:
            problems.append(problem)
            bad[m.name] = problem
    for pair in _PAIRED:
        have = [n for n in pair if callable(getattr(obj, n, None))]
        if 0 < len(have) < len(pair):
            missing = [n for n in pair if n not in have]
            problems.append(
                f"has {', '.join(have)} but not {', '.join(missing)}: the two only work together"
            )
    return problems, bad


# -- what the runner claims --------------------------------------------------------


@dataclass
class _Capabilities:
    core_problem: str | None = None
    family: str = ""
    vocab: int = 0
    bad_signatures: dict[str, str] = field(default_factory=dict)
    own_generate: bool = False
    own_pair: bool = False
    pair_note: str = ""
    sessions: str | None = "not probed"  # None when claimed, else why not
    multimodal: str | None = "not probed"


def _probe(factory: Factory) -> _Capabilities:
    caps = _Capabilities()
    try:
        runner = factory()
    except Exception as exc:
        caps.core_problem = f"factory() raised {_exc(exc)}"
        return caps
    _, caps.bad_signatures = _member_problems(runner)
    try:
        family = runner.family  # type: ignore[attr-defined]
        vocab = runner.vocab_size  # type: ignore[attr-defined]
    except Exception as exc:
        caps.core_problem = f"reading family/vocab_size raised {_exc(exc)}"
        return caps
    if not callable(getattr(runner, "predict_logits", None)):
        caps.core_problem = "predict_logits is missing"
    elif "predict_logits" in caps.bad_signatures:
        caps.core_problem = "predict_logits has an incompatible signature"
    elif not (isinstance(family, str) and family.strip()):
        caps.core_problem = f"family is {family!r}, not a non-empty str"
    elif _as_vocab(vocab) is None:
        caps.core_problem = f"vocab_size is {vocab!r}, not a positive int"
    if caps.core_problem is not None:
        return caps
    caps.family, caps.vocab = family, operator.index(vocab)
    caps.own_generate = supports_generate(runner)

    if supports_host_driven(runner):
        try:
            runner.prefill_logits([0])
            caps.own_pair = True
        except NotImplementedError as exc:
            caps.pair_note = f"its prefill_logits raised {_exc(exc)}"
        except Exception:
            caps.own_pair = True  # claimed; the host_driven clauses report the error
    else:
        caps.pair_note = "it has no prefill_logits/decode_logits"

    if not supports_prompt_cache(runner):
        caps.sessions = "runner has no prefill_logits_reusing/export_session/restore_session"
    else:
        try:
            snap = runner.export_session()
        except NotImplementedError as exc:
            caps.sessions = f"export_session() raised {_exc(exc)}"
        except Exception:
            caps.sessions = None  # claimed; the sessions clauses report the error
        else:
            after = " after a prefill" if caps.own_pair else ""
            caps.sessions = None if snap is not None else f"export_session() returned None{after}"

    if not supports_multimodal(runner):
        caps.multimodal = "runner has no multimodal members"
    else:
        try:
            claimed = runner.supports_multimodal()
        except NotImplementedError as exc:
            caps.multimodal = f"supports_multimodal() raised {_exc(exc)}"
        except Exception:
            caps.multimodal = None  # claimed; the multimodal clause reports the error
        else:
            caps.multimodal = None if claimed else "supports_multimodal() is False"
    return caps


def _as_vocab(value: object) -> int | None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        return None
    n = int(value)
    return n if n > 0 else None


# -- rows and comparisons ----------------------------------------------------------


def _row(out: object, what: str) -> npt.NDArray[np.float64]:
    """A private float64 copy of a returned logits row (copied, so later calls cannot alter it)."""
    try:
        arr = np.array(out, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise _Fail(
            f"{what} returned {type(out).__name__}, which does not convert to a row of "
            f"floats: {exc}"
        ) from exc
    if arr.ndim != 1:
        raise _Fail(f"{what} returned an array of shape {arr.shape}; expected a 1-D row")
    return arr


def _assert_close(
    got: npt.NDArray[np.float64],
    want: npt.NDArray[np.float64],
    got_what: str,
    want_what: str,
    opts: CheckOptions,
) -> None:
    if got.shape != want.shape:
        raise _Fail(f"{got_what} has {got.size} values but {want_what} has {want.size}")
    close = np.isclose(got, want, rtol=opts.rtol, atol=opts.atol)
    if close.all():
        return
    with np.errstate(invalid="ignore"):
        diff = np.where(close, 0.0, np.abs(got - want))
    diff = np.where(np.isnan(diff), np.inf, diff)
    i = int(np.argmax(diff))
    raise _Fail(
        f"{got_what} differs from {want_what} at {int((~close).sum())} of {got.size} "
        f"positions; worst at index {i}: got {got[i]:.7g}, expected {want[i]:.7g} "
        f"(atol={opts.atol:g}, rtol={opts.rtol:g})"
    )


def _tokens(out: object, what: str, vocab: int) -> list[int]:
    try:
        tokens = [operator.index(t) for t in out]  # type: ignore[attr-defined]
    except TypeError as exc:
        raise _Fail(f"{what} returned {out!r}; expected a list of int token ids") from exc
    outside = [t for t in tokens if not 0 <= t < vocab]
    if outside:
        raise _Fail(f"{what} returned tokens {outside} outside the vocabulary 0..{vocab - 1}")
    return tokens


# -- running a property with hypothesis ---------------------------------------------


class _Context:
    def __init__(self, factory: Factory, opts: CheckOptions, caps: _Capabilities) -> None:
        self.factory = factory
        self.opts = opts
        self.caps = caps

    @property
    def vocab(self) -> int:
        return self.caps.vocab

    def fresh(self) -> Any:
        try:
            return self.factory()
        except Exception as exc:
            raise _Fail(f"factory() raised {_exc(exc)}") from exc

    def generator(self, runner: Any) -> Any:
        return runner if self.caps.own_generate else with_defaults(runner)

    def pair(self, runner: Any) -> Any:
        return runner if self.caps.own_pair else HostDriven(runner)

    def tokens(self, min_size: int, max_size: int) -> SearchStrategy[list[int]]:
        from hypothesis import strategies as st

        return st.lists(st.integers(0, self.vocab - 1), min_size=min_size, max_size=max_size)

    def prompts(self) -> SearchStrategy[list[int]]:
        return self.tokens(1, self.opts.max_prompt_len)

    def for_all(
        self,
        strategy: SearchStrategy[dict[str, Any]],
        body: Callable[[dict[str, Any]], None],
    ) -> None:
        """Run ``body`` on examples from ``strategy``; raise `_Fail` with the shrunk example."""
        import hypothesis
        from hypothesis import HealthCheck, Phase, Verbosity, given, settings
        from hypothesis.errors import Flaky

        last: list[tuple[dict[str, Any], str]] = []

        @settings(
            max_examples=self.opts.max_examples,
            deadline=None,
            database=None,
            derandomize=False,
            report_multiple_bugs=False,
            verbosity=Verbosity.quiet,
            phases=(Phase.explicit, Phase.generate, Phase.shrink),
            suppress_health_check=list(HealthCheck),
        )
        @given(strategy)
        def prop(example: dict[str, Any]) -> None:
            shown = {k: (list(v) if isinstance(v, list) else v) for k, v in example.items()}
            try:
                body(example)
            except _Fail as exc:
                last[:] = [(shown, exc.message)]
                raise
            except Exception as exc:
                last[:] = [(shown, f"raised {_exc(exc)}")]
                raise

        if self.opts.seed is not None:
            prop = hypothesis.seed(self.opts.seed)(prop)
        try:
            prop()
        except Exception as exc:
            if not last:
                raise _Fail(f"hypothesis could not run this clause: {_exc(exc)}") from exc
            example, message = last[0]
            if isinstance(exc, Flaky):
                message += (
                    "\n(the failure did not reproduce when the example was replayed: the "
                    "runner's results are not a function of its inputs)"
                )
            raise _Fail(message, example) from exc


# -- the clauses --------------------------------------------------------------------


@dataclass(frozen=True)
class Clause:
    """A named rule of the runner contract and the check that tests it."""

    name: str
    summary: str
    check: Callable[[_Context], str | None]
    needs_core: bool = True
    uses: tuple[str, ...] = ()


def _structure_members(ctx: _Context) -> str | None:
    runner = ctx.fresh()
    problems, _ = _member_problems(runner)
    if problems:
        raise _Fail("; ".join(problems))
    present = [
        m.name for m in MEMBERS if not m.required and callable(getattr(runner, m.name, None))
    ]
    return f"optional members: {', '.join(present) or 'none'}"


def _structure_family(ctx: _Context) -> str | None:
    runner = ctx.fresh()
    family = _call("reading family", lambda: runner.family)
    if callable(family):
        raise _Fail(f"family is a method ({family!r}); expected a str attribute or property")
    if not isinstance(family, str):
        raise _Fail(f"family is {type(family).__name__} {family!r}; expected a non-empty str")
    if not family.strip():
        raise _Fail(f"family is {family!r}; expected a non-empty str")
    return None


def _structure_vocab_size(ctx: _Context) -> str | None:
    runner = ctx.fresh()
    vocab = _call("reading vocab_size", lambda: runner.vocab_size)
    if callable(vocab):
        raise _Fail(f"vocab_size is a method ({vocab!r}); expected an int attribute or property")
    if _as_vocab(vocab) is None:
        raise _Fail(f"vocab_size is {type(vocab).__name__} {vocab!r}; expected a positive int")
    return None


def _logits_row(ctx: _Context) -> str | None:
    from hypothesis import strategies as st

    vocab = ctx.vocab
    f32_max = float(np.finfo(np.float32).max)

    def body(ex: dict[str, Any]) -> None:
        prompt = ex["prompt"]
        what = f"predict_logits({_show(prompt)})"
        out = _call(what, ctx.fresh().predict_logits, list(prompt))
        if isinstance(out, np.ndarray) and out.dtype != np.float32:
            raise _Fail(f"{what} returned a numpy array of dtype {out.dtype}; expected float32")
        row = _row(out, what)
        if row.size != vocab:
            raise _Fail(f"{what} returned {row.size} values; expected vocab_size={vocab}")
        bad = np.flatnonzero(~np.isfinite(row) | (np.abs(row) > f32_max))
        if bad.size:
            raise _Fail(
                f"{what} has {bad.size} value(s) that are not finite float32, first at index "
                f"{int(bad[0])}: {row[bad[0]]!r}; expected {vocab} finite float32 values"
            )

    ctx.for_all(st.fixed_dictionaries({"prompt": ctx.prompts()}), body)
    return None


def _logits_deterministic(ctx: _Context) -> str | None:
    from hypothesis import strategies as st

    def body(ex: dict[str, Any]) -> None:
        prompt, other = ex["prompt"], ex["other"]
        runner = ctx.fresh()
        what = f"predict_logits({_show(prompt)})"
        first_out = _call(what, runner.predict_logits, list(prompt))
        first = _row(first_out, what)
        _call(f"predict_logits({_show(other)})", runner.predict_logits, list(other))
        _assert_close(
            _row(first_out, what),
            first,
            f"the row {what} returned, read again after predict_logits({_show(other)}),",
            "its value when returned (the runner hands out a buffer it later overwrites)",
            ctx.opts,
        )
        again = _row(_call(what, runner.predict_logits, list(prompt)), what)
        _assert_close(again, first, f"a second {what}", "the first", ctx.opts)

    ctx.for_all(st.fixed_dictionaries({"prompt": ctx.prompts(), "other": ctx.prompts()}), body)
    return None


def _greedy_note(ctx: _Context) -> str | None:
    if ctx.caps.own_generate:
        return None
    return "via rlx_lm.with_defaults: the runner has no generate of its own"


def _greedy_stop(ctx: _Context) -> str | None:
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

        what = f"generate({_show(prompt)}, {n_new}, on_token)"
        gen = ctx.generator(ctx.fresh())
        out = _tokens(_call(what, gen.generate, list(prompt), n_new, on_token), what, ctx.vocab)
        if len(seen) != stop_after:
            raise _Fail(
                f"{what} called on_token {len(seen)} time(s) ({seen}); on_token returned "
                f"False on call {stop_after}, so generation should have stopped there"
            )
        if out != seen:
            raise _Fail(
                f"{what} returned {out}, but on_token saw {seen} and returned False on the "
                f"last one; expected {seen}: the stopping token is kept"
            )

    ctx.for_all(examples(), body)
    return _greedy_note(ctx)


def _greedy_argmax(ctx: _Context) -> str | None:
    from hypothesis import strategies as st

    opts = ctx.opts

    def body(ex: dict[str, Any]) -> None:
        prompt, n_new = ex["prompt"], ex["n_new"]
        seen: list[int] = []

        def on_token(token: int) -> bool:
            seen.append(int(token))
            return True

        what = f"generate({_show(prompt)}, {n_new}, on_token)"
        gen = ctx.generator(ctx.fresh())
        out = _tokens(_call(what, gen.generate, list(prompt), n_new, on_token), what, ctx.vocab)
        if len(out) != n_new:
            raise _Fail(
                f"{what} returned {len(out)} tokens {out}; expected {n_new}, as on_token "
                f"never asked it to stop"
            )
        if seen != out:
            raise _Fail(f"{what} returned {out} but on_token saw {seen}; expected the same")
        ref = ctx.fresh()
        context = list(prompt)
        for step, token in enumerate(out):
            p_what = f"predict_logits({_show(context)})"
            row = _row(_call(p_what, ref.predict_logits, list(context)), p_what)
            best = _call(f"rlx_lm.argmax({p_what})", argmax, row.astype(np.float32))
            margin = opts.atol + opts.rtol * abs(row[best])
            if token != best and not row[token] >= row[best] - margin:
                raise _Fail(
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


def _pair_note(ctx: _Context) -> str | None:
    if ctx.caps.own_pair:
        return None
    return f"via rlx_lm.HostDriven: {ctx.caps.pair_note}"


def _host_prefill(ctx: _Context) -> str | None:
    from hypothesis import strategies as st

    def body(ex: dict[str, Any]) -> None:
        prompt, previous = ex["prompt"], ex["previous"]
        pair = ctx.pair(ctx.fresh())
        if previous:
            _call(f"prefill_logits({_show(previous)})", pair.prefill_logits, list(previous))
        what = f"prefill_logits({_show(prompt)})"
        if previous:
            what += f" following prefill_logits({_show(previous)})"
        got = _row(_call(what, pair.prefill_logits, list(prompt)), what)
        want_what = f"predict_logits({_show(prompt)})"
        want = _row(_call(want_what, ctx.fresh().predict_logits, list(prompt)), want_what)
        _assert_close(got, want, what, want_what, ctx.opts)

    examples = st.fixed_dictionaries(
        {"prompt": ctx.prompts(), "previous": ctx.tokens(0, ctx.opts.max_prompt_len)}
    )
    ctx.for_all(examples, body)
    return _pair_note(ctx)


def _host_decode(ctx: _Context) -> str | None:
    from hypothesis import strategies as st

    def body(ex: dict[str, Any]) -> None:
        prompt, continuation = ex["prompt"], ex["continuation"]
        pair = ctx.pair(ctx.fresh())
        ref = ctx.fresh()
        _call(f"prefill_logits({_show(prompt)})", pair.prefill_logits, list(prompt))
        context = list(prompt)
        for i, token in enumerate(continuation):
            what = f"decode_logits({token}) after prefill_logits({_show(prompt)})"
            if i:
                what += f" and decoding {_show(continuation[:i])}"
            got = _row(_call(what, pair.decode_logits, token), what)
            context.append(token)
            want_what = f"predict_logits({_show(context)})"
            want = _row(_call(want_what, ref.predict_logits, list(context)), want_what)
            _assert_close(got, want, what, want_what, ctx.opts)

    examples = st.fixed_dictionaries(
        {"prompt": ctx.prompts(), "continuation": ctx.tokens(1, ctx.opts.max_new_tokens)}
    )
    ctx.for_all(examples, body)
    return _pair_note(ctx)


def _host_decode_before_prefill(ctx: _Context) -> str | None:
    pair = ctx.pair(ctx.fresh())
    try:
        out = pair.decode_logits(0)
    except Exception as exc:
        note = f"raised {type(exc).__name__}"
        extra = _pair_note(ctx)
        return f"{note}; {extra}" if extra else note
    raise _Fail(
        f"decode_logits(0) on a fresh runner returned {type(out).__name__} instead of raising; "
        f"expected an error (such as rlx_lm.SequenceStateError): there is no sequence to continue"
    )


def _need_sessions(ctx: _Context) -> None:
    if ctx.caps.sessions is not None:
        raise _Skip(f"the runner does not claim sessions: {ctx.caps.sessions}")
    if not ctx.caps.own_pair:
        raise _Fail(
            "the runner exports sessions but has no working prefill_logits/decode_logits pair "
            f"({ctx.caps.pair_note}); a restored session cannot be continued without one"
        )


def _export(runner: Any, what: str) -> SessionSnapshot:
    snap = _call(f"export_session() {what}", runner.export_session)
    if not isinstance(snap, SessionSnapshot):
        raise _Fail(
            f"export_session() {what} returned {type(snap).__name__} {snap!r}; expected an "
            f"rlx_lm.SessionSnapshot"
        )
    return snap


def _restore(runner: Any, snap: SessionSnapshot, what: str) -> None:
    applied = _call(f"restore_session({what})", runner.restore_session, snap)
    if applied is not True:
        raise _Fail(f"restore_session({what}) returned {applied!r}; expected True")


def _sessions_roundtrip(ctx: _Context) -> str | None:
    from hypothesis import strategies as st

    _need_sessions(ctx)
    n = ctx.opts.max_new_tokens

    def decode_all(runner: Any, tokens: Sequence[int], what: str) -> list[Any]:
        return [
            _row(_call(f"{what}: decode_logits({t})", runner.decode_logits, t), what)
            for t in tokens
        ]

    def body(ex: dict[str, Any]) -> None:
        prompt, before, after = ex["prompt"], ex["before"], ex["after"]
        start = f"prefill_logits({_show(prompt)})" + (
            f" and decoding {_show(before)}" if before else ""
        )
        reference = ctx.fresh()
        _call(start, reference.prefill_logits, list(prompt))
        decode_all(reference, before, "uninterrupted run")
        want = decode_all(reference, after, "uninterrupted run")

        live = ctx.fresh()
        _call(start, live.prefill_logits, list(prompt))
        decode_all(live, before, start)
        snap = _export(live, f"after {start}")
        if list(snap.tokens) != [*prompt, *before]:
            raise _Fail(
                f"export_session() after {start} has tokens {list(snap.tokens)}; "
                f"expected {[*prompt, *before]}"
            )
        cont = f"decoding {_show(after)}"

        def compare(got: list[Any], how: str) -> None:
            for t, g, w in zip(after, got, want, strict=True):
                _assert_close(
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


def _sessions_reuse(ctx: _Context) -> str | None:
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
        full = f"prefill_logits({_show(prompt)})"
        reference = ctx.fresh()
        want = _row(_call(full, reference.prefill_logits, list(prompt)), full)
        want_next = _row(
            _call(f"decode_logits({nxt}) after {full}", reference.decode_logits, nxt), full
        )
        seq = [*prompt[:cached], *tail]
        runner = ctx.fresh()
        _call(f"prefill_logits({_show(seq)})", runner.prefill_logits, seq)
        snap = _export(runner, f"after prefill_logits({_show(seq)})")
        for reuse in range(cached + 1):
            what = (
                f"prefill_logits_reusing({_show(prompt)}, snapshot of {_show(seq)}, "
                f"reuse_len={reuse})"
            )
            got = _row(_call(what, runner.prefill_logits_reusing, list(prompt), snap, reuse), what)
            _assert_close(got, want, what, full, ctx.opts)
            after = f"decode_logits({nxt}) after {what}"
            got_next = _row(_call(after, runner.decode_logits, nxt), after)
            _assert_close(
                got_next, want_next, after, f"decode_logits({nxt}) after {full}", ctx.opts
            )

    ctx.for_all(examples(), body)
    return None


def _foreign_fingerprints(own: ModelFingerprint | None, family: str) -> list[ModelFingerprint]:
    if own is None:
        return [ModelFingerprint(f"{family}-foreign", (0,), "rlx-conformance-foreign")]
    return [
        ModelFingerprint(f"{own.family}-foreign", own.geometry, own.model_id),
        ModelFingerprint(own.family, (*own.geometry, 1), own.model_id),
    ]


def _sessions_foreign(ctx: _Context) -> str | None:
    from hypothesis import strategies as st

    _need_sessions(ctx)

    def body(ex: dict[str, Any]) -> None:
        prompt, nxt = ex["prompt"], ex["next"]
        start = f"prefill_logits({_show(prompt)})"
        reference = ctx.fresh()
        _call(start, reference.prefill_logits, list(prompt))
        want = _row(_call(f"decode_logits({nxt})", reference.decode_logits, nxt), start)

        runner = ctx.fresh()
        _call(start, runner.prefill_logits, list(prompt))
        own = _export(runner, f"after {start}")
        for fp in _foreign_fingerprints(own.fingerprint, ctx.caps.family):
            foreign = SessionSnapshot(own.kv, own.tokens, fp)
            what = f"restore_session(a snapshot with fingerprint {fp})"
            try:
                applied = runner.restore_session(foreign)
            except ValueError:
                continue
            except Exception as exc:
                raise _Fail(
                    f"{what} raised {_exc(exc)}; expected a ValueError such as "
                    f"rlx_lm.SnapshotMismatchError"
                ) from exc
            raise _Fail(
                f"{what} returned {applied!r} (runner's own fingerprint: {own.fingerprint}); "
                f"expected rlx_lm.SnapshotMismatchError"
            )
        after = f"decode_logits({nxt}) after {start} and refused foreign restores"
        got = _row(_call(after, runner.decode_logits, nxt), after)
        _assert_close(
            got,
            want,
            after,
            f"decode_logits({nxt}) after {start} (the session as it was)",
            ctx.opts,
        )

    examples = st.fixed_dictionaries(
        {"prompt": ctx.prompts(), "next": st.integers(0, ctx.vocab - 1)}
    )
    ctx.for_all(examples, body)
    return None


def _multimodal_phases(ctx: _Context) -> str | None:
    if ctx.caps.multimodal is not None:
        raise _Skip(f"the runner does not claim multimodal generation: {ctx.caps.multimodal}")
    w, h = ctx.opts.image_size
    rgb = bytes(i % 251 for i in range(w * h * 3))
    runner = ctx.fresh()
    phases: list[str] = []
    _call("set_multimodal_phase_callback(cb)", runner.set_multimodal_phase_callback, phases.append)
    what = f"generate_multimodal({ctx.opts.multimodal_prompt!r}, <{w}x{h} RGB>, {w}, {h}, None, 1)"
    out = _call(
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
    _tokens(out, what, ctx.vocab)
    if "vision" not in phases or "prefill" not in phases:
        raise _Fail(
            f"{what} fired the phase callback with {phases}; expected 'vision' then 'prefill'"
        )
    if phases.index("vision") > phases.index("prefill") or phases[0] != "vision":
        raise _Fail(
            f"{what} fired the phase callback with {phases}; expected 'vision' first, then "
            f"'prefill'"
        )
    fired = len(phases)
    _call("set_multimodal_phase_callback(None)", runner.set_multimodal_phase_callback, None)
    _call(what, runner.generate_multimodal, ctx.opts.multimodal_prompt, rgb, w, h, None, 1, None)
    if len(phases) != fired:
        raise _Fail(
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
        "multimodal.phases",
        "the phase callback fires 'vision' then 'prefill', and None clears it",
        _multimodal_phases,
        uses=("set_multimodal_phase_callback", "generate_multimodal"),
    ),
)


def clause_names() -> list[str]:
    """Names of every clause, in the order they run."""
    return [c.name for c in CLAUSES]


def _select(names: Iterable[str] | None) -> list[Clause]:
    if names is None:
        return list(CLAUSES)
    wanted = list(names)
    chosen = [c for c in CLAUSES if any(c.name == n or c.name.startswith(n + ".") for n in wanted)]
    unknown = [
        n for n in wanted if not any(c.name == n or c.name.startswith(n + ".") for c in CLAUSES)
    ]
    if unknown:
        raise InvalidOptionError(
            f"unknown clause(s) {unknown}; the clauses are {clause_names()} (a prefix such as "
            f"'sessions' selects a group)"
        )
    return chosen


def _run(clause: Clause, factory: Factory, opts: CheckOptions, caps: _Capabilities) -> ClauseResult:
    start = time.perf_counter()

    def result(status: Any, message: str = "", example: Any = None) -> ClauseResult:
        return ClauseResult(clause.name, status, message, example, time.perf_counter() - start)

    if clause.needs_core and caps.core_problem is not None:
        return result("skip", f"cannot run: {caps.core_problem} (see the structure.* clauses)")
    broken = [m for m in clause.uses if m in caps.bad_signatures]
    if broken:
        return result(
            "skip",
            f"cannot run: {', '.join(broken)} has an incompatible signature "
            f"(see structure.members)",
        )
    try:
        note = clause.check(_Context(factory, opts, caps))
    except _Skip as exc:
        return result("skip", str(exc))
    except _Fail as exc:
        return result("fail", exc.message, exc.example)
    return result("pass", note or "")


def _describe(factory: Factory) -> str:
    module = getattr(factory, "__module__", None)
    name = getattr(factory, "__qualname__", None) or repr(factory)
    return f"{module}:{name}" if module else name


def run_clause(name: str, factory: Factory, options: CheckOptions | None = None) -> ClauseResult:
    """Run the one clause called ``name`` against runners from ``factory``."""
    require_hypothesis()
    clauses = [c for c in CLAUSES if c.name == name]
    if not clauses:
        raise InvalidOptionError(f"unknown clause {name!r}; the clauses are {clause_names()}")
    opts = options or CheckOptions()
    return _run(clauses[0], factory, opts, _probe(factory))


def check_runner(
    factory: Factory,
    *,
    clauses: Iterable[str] | None = None,
    atol: float = DEFAULT_ATOL,
    rtol: float = DEFAULT_RTOL,
    max_examples: int = DEFAULT_MAX_EXAMPLES,
    max_prompt_len: int = DEFAULT_MAX_PROMPT_LEN,
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
    seed: int | None = 0,
    image_size: tuple[int, int] = (8, 8),
    multimodal_prompt: str = CheckOptions.multimodal_prompt,
    name: str | None = None,
) -> Report:
    """Check runners built by ``factory`` against every clause (or those named in ``clauses``).

    ``atol``/``rtol`` bound the difference between logits rows that must agree;
    ``max_examples`` is the hypothesis budget per clause; ``seed`` fixes the drawn
    examples (None draws new ones each run). The report lists pass/fail/skip per
    clause; call `Report.raise_for_failures` to turn failures into an exception.
    """
    require_hypothesis()
    opts = CheckOptions(
        atol=atol,
        rtol=rtol,
        max_examples=max_examples,
        max_prompt_len=max_prompt_len,
        max_new_tokens=max_new_tokens,
        seed=seed,
        image_size=image_size,
        multimodal_prompt=multimodal_prompt,
    )
    chosen = _select(clauses)
    caps = _probe(factory)
    results = tuple(_run(c, factory, opts, caps) for c in chosen)
    return Report(name or _describe(factory), results)
