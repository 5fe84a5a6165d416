"""``rlx-lm check pkg.module:factory``: run the conformance clauses from the shell."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from typing import TextIO

from rlx_lm.errors import InvalidOptionError
from rlx_lm.testing.capabilities import Factory
from rlx_lm.testing.clauses import CLAUSES
from rlx_lm.testing.conformance import check_runner
from rlx_lm.testing.options import (
    DEFAULT_ATOL,
    DEFAULT_MAX_EXAMPLES,
    DEFAULT_MAX_NEW_TOKENS,
    DEFAULT_MAX_PROMPT_LEN,
    DEFAULT_RTOL,
    require_hypothesis,
)

__all__ = ["cli_check", "load_factory"]


def _import(module: str) -> object:
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        # Like ``python -m``, let a module in the working directory be found.
        cwd = os.getcwd()
        top = module.split(".")[0]
        if exc.name == top and cwd not in sys.path and "" not in sys.path:
            sys.path.append(cwd)
            return importlib.import_module(module)
        raise


def load_factory(spec: str) -> Factory:
    """Resolve ``"pkg.module:attr"`` (attr may be dotted) to the callable that builds a runner."""
    module_name, sep, attr_path = spec.partition(":")
    if not sep or not module_name or not attr_path:
        raise InvalidOptionError(
            f"runner spec {spec!r} must look like 'pkg.module:factory' (a module, a colon, and "
            f"a callable in it that returns a fresh runner)"
        )
    try:
        obj = _import(module_name)
    except ImportError as exc:
        raise InvalidOptionError(f"cannot import {module_name!r} for {spec!r}: {exc}") from exc
    for part in attr_path.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError as exc:
            raise InvalidOptionError(
                f"{spec!r}: {type(obj).__name__} {getattr(obj, '__name__', obj)!r} has no "
                f"attribute {part!r}"
            ) from exc
    if not callable(obj):
        raise InvalidOptionError(
            f"{spec!r} is a {type(obj).__name__}, not a callable that builds a runner"
        )
    return obj


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="rlx-lm check",
        description="Check that runners built by a factory keep the rlx_lm runner contract, "
        "clause by clause. Exit status: 0 all clauses held, 1 a clause failed, 2 usage error.",
    )
    p.add_argument(
        "spec", nargs="?", help="pkg.module:factory, a callable returning a fresh runner"
    )
    p.add_argument(
        "--clause",
        action="append",
        dest="clauses",
        metavar="NAME",
        help="run only this clause or group (e.g. 'sessions'); repeatable",
    )
    p.add_argument("--list", action="store_true", help="list the clauses and exit")
    p.add_argument(
        "--atol",
        type=float,
        default=DEFAULT_ATOL,
        help="absolute logits tolerance (default: %(default)s)",
    )
    p.add_argument(
        "--rtol",
        type=float,
        default=DEFAULT_RTOL,
        help="relative logits tolerance (default: %(default)s)",
    )
    p.add_argument(
        "--max-examples",
        type=int,
        default=DEFAULT_MAX_EXAMPLES,
        help="hypothesis examples per clause (default: %(default)s)",
    )
    p.add_argument(
        "--max-prompt-len",
        type=int,
        default=DEFAULT_MAX_PROMPT_LEN,
        help="longest prompt drawn (default: %(default)s)",
    )
    p.add_argument(
        "--max-new-tokens",
        type=int,
        default=DEFAULT_MAX_NEW_TOKENS,
        help="most tokens generated or decoded per example (default: %(default)s)",
    )
    p.add_argument(
        "--seed",
        default="0",
        help="hypothesis seed: an int, or 'random' for new examples (default: %(default)s)",
    )
    return p


def _seed(text: str) -> int | None:
    if text == "random":
        return None
    try:
        return int(text)
    except ValueError as exc:
        raise InvalidOptionError(f"--seed must be an int or 'random', got {text!r}") from exc


def cli_check(
    argv: Sequence[str] | None = None, *, out: TextIO | None = None, err: TextIO | None = None
) -> int:
    """Run ``rlx-lm check`` with ``argv``; print the report and return the exit status."""
    out = out or sys.stdout
    err = err or sys.stderr
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 2
    if args.list:
        width = max(len(c.name) for c in CLAUSES)
        for c in CLAUSES:
            out.write(f"{c.name:<{width}}  {c.summary}\n")
        return 0
    if not args.spec:
        err.write("rlx-lm check: error: give a runner spec, pkg.module:factory\n")
        return 2
    try:
        require_hypothesis()
        factory = load_factory(args.spec)
        report = check_runner(
            factory,
            clauses=args.clauses,
            atol=args.atol,
            rtol=args.rtol,
            max_examples=args.max_examples,
            max_prompt_len=args.max_prompt_len,
            max_new_tokens=args.max_new_tokens,
            seed=_seed(args.seed),
            name=args.spec,
        )
    except (ImportError, InvalidOptionError) as exc:
        err.write(f"rlx-lm check: error: {exc}\n")
        return 2
    out.write(report.format() + "\n")
    return 0 if report.ok else 1
