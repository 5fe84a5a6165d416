"""Whether the caller of a call throws its result away, read from the caller's bytecode.

`LmRunnerBuilder`'s setters return a changed copy; ``b.max_seq(512)`` as a statement
loses it. A call whose next instruction is ``POP_TOP`` is such an expression statement.
That reading depends on how the interpreter lays out bytecode and reports ``f_lasti``,
which changes between CPython versions, so `reliable` checks it once, on probe
functions compiled by the running interpreter, against what is known about them; where
any answer is wrong (another version's bytecode, another implementation), the check is
off: it never raises a false alarm, it only misses the mistake. Standard library only,
so that a test can run this file under other interpreters.
"""

from __future__ import annotations

import bisect
import dis
import functools
import sys
import types

__all__ = ["reliable", "result_discarded"]


@functools.lru_cache(maxsize=512)
def _instructions(code: types.CodeType) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """The offsets and names of ``code``'s instructions (inline caches left out)."""
    ins = [i for i in dis.get_instructions(code) if i.opname != "CACHE"]
    return tuple(i.offset for i in ins), tuple(i.opname for i in ins)


def result_discarded(frame: types.FrameType) -> bool:
    """Whether the call ``frame`` is in the middle of is an expression statement.

    The instruction after the call (``f_lasti`` is the call, or on 3.11 its last inline
    cache) is then POP_TOP: the value is thrown away. Only meaningful where `reliable`.
    """
    offsets, names = _instructions(frame.f_code)
    i = bisect.bisect_right(offsets, frame.f_lasti)
    return i < len(names) and names[i] == "POP_TOP"


_PROBES = """
def statement(o):
    o.m()

def assigned(o):
    x = o.m()
    return x

def chained(o):
    o.m().m()

def returned(o):
    return o.m()

def argument(o):
    return [id(o.m()), o.m()]

def conditional(o, flag=True):
    if flag:
        o.m()
    return None

def in_loop(o):
    for _ in range(2):
        y = o.m()
    return y

def evaluated(o):
    return eval("o.m()", {"o": o})
"""

#: What each probe's calls do with their results, in call order: True where thrown away.
_EXPECTED = {
    "statement": [True],
    "assigned": [False],
    "chained": [False, True],
    "returned": [False],
    "argument": [False, False],
    "conditional": [True],
    "in_loop": [False, False],
    "evaluated": [False],
}


class _Probe:
    def __init__(self) -> None:
        self.seen: list[bool] = []

    def m(self) -> _Probe:
        frame = sys._getframe(1)
        self.seen.append(result_discarded(frame))
        return self


@functools.lru_cache(maxsize=1)
def reliable() -> bool:
    """Whether `result_discarded` gives the known answer on every probe here."""
    try:
        scope: dict[str, object] = {}
        exec(compile(_PROBES, "<rlx_lm._discarded probes>", "exec"), scope)
        for name, want in _EXPECTED.items():
            probe = _Probe()
            scope[name](probe)  # type: ignore[operator]
            if probe.seen != want:
                return False
        return True
    except Exception:  # no frames, no bytecode to read: the check stays off
        return False
