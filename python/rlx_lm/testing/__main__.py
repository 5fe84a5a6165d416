"""``python -m rlx_lm.testing pkg.module:factory``: the conformance check from the shell."""

from __future__ import annotations

import sys

from rlx_lm.testing.cli import cli_check

if __name__ == "__main__":
    raise SystemExit(cli_check(sys.argv[1:]))
