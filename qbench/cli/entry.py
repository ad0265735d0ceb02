"""The `qbench` script (and `python -m qbench.cli`): the command runs in a supervised child process
(qbench.supervisor), whose commands are qbench.cli.app. Imports the standard library alone.

Exit codes: 0 success / gate passed, 1 gate breached, 2 anything else, a crash of the child included.
"""

from __future__ import annotations

import sys

from qbench.supervisor import supervise


def main(argv: list[str] | None = None) -> int:
    """Run `qbench ARGV` (default: this process's arguments) in a supervised child; its exit code."""
    return supervise(list(argv if argv is not None else sys.argv[1:]))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
