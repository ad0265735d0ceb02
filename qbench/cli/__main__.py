"""`python -m qbench.cli ARGS`: the `qbench` script (importing this module runs nothing)."""

import sys

from qbench.cli import main

if __name__ == "__main__":
    sys.exit(main())
