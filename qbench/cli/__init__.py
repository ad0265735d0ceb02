"""The `qbench` command: a thin layer over the library, run in a supervised child process.

`main` is the `qbench` script's entry point (`qbench = "qbench.cli:main"`); it imports the supervisor only when
called, so importing a module of this package does not.
"""

from __future__ import annotations


def main(argv: list[str] | None = None) -> int:
    """Run `qbench ARGV` in a supervised child process; its exit code (see qbench.cli.entry)."""
    from qbench.cli.entry import main as run

    return run(argv)
