"""The long campaign of the stateful machines of ``tests/test_kv_stateful.py``.

``python tests/stateful_campaign.py MACHINE SECONDS [SEED]`` (``make fuzz-stateful``) runs
the machine's own rules and invariants, unchanged, with every choice drawn from a seeded
PRNG instead of hypothesis: the rule (among those whose preconditions hold), its arguments
(from the integer ranges and lists its ``@rule`` declares) and whatever its body draws. As
in the sampler campaign, hypothesis's drawing cost many times the checks, and the goal here
is executions. An execution is one rule step followed by every invariant; a run is
``--steps`` of them on a fresh machine (then its teardown). A failure prints the seed, the
run and the steps of that run, which the same command replays. Hypothesis still runs the
machines in ``make check`` (shrinking, the CI profile) and ``make fuzz-io`` (deep profile).
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

import test_kv_stateful as machines

MACHINES = {
    "kv": machines.KvCacheMachine,
    "kv_float16": machines.Float16Machine,
    "kv_page_rows": machines.PageRowsMachine,
    "prompt_cache": machines.PromptCacheMachine,
}


class Spec:
    """A strategy the machines use, as something a PRNG can draw: integers(lo, hi),
    sampled_from(values), lists(of, max_size) and data()."""

    def __init__(self, kind: str, *args: Any) -> None:
        self.kind, self.args = kind, args

    def draw(self, rng: random.Random) -> Any:
        if self.kind == "int":
            lo, hi = self.args
            return rng.randint(lo, hi)
        if self.kind == "pick":
            (values,) = self.args
            return values[rng.randrange(len(values))]
        if self.kind == "list":
            of, max_size = self.args
            return [of.draw(rng) for _ in range(rng.randint(0, max_size))]
        raise AssertionError(f"no draw for {self.kind}")


class PrngStrategies:
    """Stands in for ``hypothesis.strategies`` in the machines' module while the campaign
    runs, so that a rule body's ``data.draw(st.integers(...))`` draws from the PRNG."""

    @staticmethod
    def integers(min_value: int, max_value: int) -> Spec:
        return Spec("int", min_value, max_value)

    @staticmethod
    def sampled_from(values: Sequence[Any]) -> Spec:
        return Spec("pick", list(values))

    @staticmethod
    def lists(of: Spec, *, max_size: int) -> Spec:
        return Spec("list", of, max_size)


class PrngData:
    """What a rule's ``data`` argument is here: ``draw`` from the PRNG."""

    def __init__(self, rng: random.Random) -> None:
        self._rng = rng

    def draw(self, spec: Spec) -> Any:
        return spec.draw(self._rng)


def argument(strategy: Any, rng: random.Random) -> Any:
    """One value of a ``@rule`` argument's (hypothesis) strategy: the kinds the machines use."""
    s = getattr(strategy, "wrapped_strategy", strategy)
    kind = type(s).__name__
    if kind == "IntegersStrategy":
        return rng.randint(s.start, s.end)
    if kind == "SampledFromStrategy":
        return s.elements[rng.randrange(len(s.elements))]
    if kind == "DataStrategy":
        return PrngData(rng)
    raise AssertionError(f"the campaign cannot draw {strategy!r}; add its kind to argument()")


def campaign(name: str, seconds: float, seed: int | None = None, steps: int = 50) -> int:
    """Runs of ``steps`` executions on fresh machines until ``seconds`` are up; the count."""
    seed = random.SystemRandom().randrange(2**63) if seed is None else seed
    rng = random.Random(seed)
    cls = MACHINES[name]
    state = cls.setup_state()
    real_st, machines.st = machines.st, PrngStrategies  # type: ignore[assignment]
    start = time.monotonic()
    deadline, report = start + seconds, start + 600
    done = runs = 0

    def summary(how: str) -> None:
        print(
            f"stateful {name} (seed {seed}): {done} executions in {runs} runs of up to "
            f"{steps} steps in {time.monotonic() - start:.0f} s, {how}",
            flush=True,
        )

    try:
        while runs == 0 or time.monotonic() < deadline:
            machine = cls()
            trail: list[str] = []
            try:
                for _ in range(steps):
                    ready = [r for r in state.rules if all(p(machine) for p in r.preconditions)]
                    rule = ready[rng.randrange(len(ready))]
                    kwargs = {k: argument(s, rng) for k, s in rule.arguments.items()}
                    trail.append(rule.function.__name__)
                    rule.function(machine, **kwargs)
                    for inv in state.invariants:
                        if all(p(machine) for p in inv.preconditions):
                            inv.function(machine)
                    done += 1
            except Exception:
                print(f"FAILED in run {runs} of seed {seed} after the steps {trail}", flush=True)
                raise
            finally:
                machine.teardown()
            runs += 1
            if time.monotonic() > report:
                summary("running")
                report += 600
    except KeyboardInterrupt:
        summary("interrupted, no failure")
        return 0
    finally:
        machines.st = real_st
    summary("no failure")
    return 0


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("machine", choices=sorted(MACHINES))
    ap.add_argument("seconds", type=float)
    ap.add_argument("seed", type=int, nargs="?")
    ap.add_argument("--steps", type=int, default=50)
    a = ap.parse_args()
    if os.access("/dev/shm", os.W_OK):  # the prompt cache's files: 1.3x the steps in memory
        tempfile.tempdir = "/dev/shm"
    sys.exit(campaign(a.machine, a.seconds, a.seed, a.steps))
