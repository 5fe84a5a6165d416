"""What a runner has: the protocol's members with signature checks, and the capability probe.

The member table is read from the protocols in `rlx_lm.runner`, so it cannot drift from
them. The probe decides, once per run, which capabilities the runner claims (and so are
tested on the runner itself) and which are tested through rlx_lm's defaults or skipped.
"""

from __future__ import annotations

import inspect
import operator
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

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
)
from rlx_lm.testing.report import format_error

__all__ = [
    "MEMBERS",
    "SAME_OBJECT",
    "Capabilities",
    "Factory",
    "Member",
    "as_vocab_size",
    "member_problems",
    "probe_capabilities",
]


Factory = Callable[[], object]
"""Builds a fresh runner; called several times per clause, so it should be cheap."""


@dataclass(frozen=True)
class Member:
    """One member of the runner protocols: its name, protocol and positional parameters."""

    name: str
    protocol: str
    required: bool
    is_property: bool
    params: tuple[str, ...] = ()
    n_required: int = 0


def _protocol_members() -> tuple[Member, ...]:
    groups: list[tuple[type, bool]] = [
        (LmCore, True),
        (LmRunner, False),
        (SupportsHostDriven, False),
        (SupportsPromptCache, False),
        (SupportsKvStats, False),
        (SupportsMultimodal, False),
    ]
    members: list[Member] = []
    for proto, required in groups:
        for name, value in vars(proto).items():
            if name.startswith("_"):
                continue
            if isinstance(value, property):
                members.append(Member(name, proto.__name__, required, is_property=True))
            elif inspect.isfunction(value):
                params = list(inspect.signature(value).parameters.values())[1:]
                members.append(
                    Member(
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
# Members the kit always calls with every parameter, so a runner may make the optional ones
# required: the reference design's generate(prompt_ids, n_new, on_token) has no default.
_ALWAYS_FULL = frozenset({"generate"})
_PAIRED = (("prefill_logits", "decode_logits"), ("export_session", "restore_session"))


def _signature_problem(obj: object, member: Member) -> str | None:
    """Why ``obj.<member>`` cannot be called the way the protocol calls it, or None."""
    fn = getattr(obj, member.name)
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return None  # not introspectable (some builtins): give it the benefit of the doubt
    counts = (
        {len(member.params)}
        if member.name in _ALWAYS_FULL
        else {member.n_required, len(member.params)}
    )
    for n in sorted(counts):
        try:
            sig.bind(*range(n))
        except TypeError as exc:
            call = f"{member.name}({', '.join(member.params[:n])})"
            return (
                f"{member.name}{sig} cannot be called as {call} "
                f"(the {member.protocol} protocol passes these positionally): {exc}"
            )
    return None


def member_problems(obj: object) -> tuple[list[str], dict[str, str]]:
    """Problems with the members, and which present methods have unusable signatures."""
    problems: list[str] = []
    bad: dict[str, str] = {}
    for m in MEMBERS:
        try:
            present = hasattr(obj, m.name)
        except Exception as exc:  # a property that raises
            problems.append(f"reading {m.name} raised {format_error(exc)}")
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
class Capabilities:
    """What the probe found: the core's usability, bad signatures, and each claimed capability."""

    core_problem: str | None = None
    family: str = ""
    vocab: int = 0
    bad_signatures: dict[str, str] = field(default_factory=dict)
    own_generate: bool = False
    own_pair: bool = False
    pair_note: str = ""
    sessions: str | None = "not probed"  # None when claimed, else why not
    multimodal: str | None = "not probed"


SAME_OBJECT = "factory() returned the same object twice; it must build a fresh runner per call"


def probe_capabilities(factory: Factory) -> Capabilities:
    """Build one runner and record what it claims, or why its core members are unusable."""
    caps = Capabilities()
    try:
        runner = factory()
        again = factory()
    except Exception as exc:
        caps.core_problem = f"factory() raised {format_error(exc)}"
        return caps
    if again is runner:
        caps.core_problem = SAME_OBJECT
        return caps
    _, caps.bad_signatures = member_problems(runner)
    try:
        family = runner.family  # type: ignore[attr-defined]
        vocab = runner.vocab_size  # type: ignore[attr-defined]
    except Exception as exc:
        caps.core_problem = f"reading family/vocab_size raised {format_error(exc)}"
        return caps
    if not callable(getattr(runner, "predict_logits", None)):
        caps.core_problem = "predict_logits is missing"
    elif "predict_logits" in caps.bad_signatures:
        caps.core_problem = "predict_logits has an incompatible signature"
    elif not (isinstance(family, str) and family.strip()):
        caps.core_problem = f"family is {family!r}, not a non-empty str"
    elif as_vocab_size(vocab) is None:
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
            caps.pair_note = f"its prefill_logits raised {format_error(exc)}"
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
            caps.sessions = f"export_session() raised {format_error(exc)}"
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
            caps.multimodal = f"supports_multimodal() raised {format_error(exc)}"
        except Exception:
            caps.multimodal = None  # claimed; the multimodal clause reports the error
        else:
            caps.multimodal = None if claimed else "supports_multimodal() is False"
    return caps


def as_vocab_size(value: object) -> int | None:
    """``value`` as a positive int vocabulary size, or None when it is not one."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        return None
    n = int(value)
    return n if n > 0 else None
