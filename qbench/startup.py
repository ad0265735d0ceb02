"""A qbench process of its own setting up: its imports (and the tracking process's opening of its store) run without
Python's cyclic garbage collector, and what they made is then frozen out of its sight.

Importing what a sweep needs (typer, pydantic, pandas, qbench's modules) or MLflow, and opening MLflow's SQL store
(SQLAlchemy's schema), make hundreds of thousands of objects that live as long as the process: modules, classes,
functions, schemas. The collector traverses them at every full collection, and they fill its younger generations as
they are made: in a `qbench sweep` of the digits demo the command's process spent 0.76 s in collections and the
tracking process 2.6 s (seven full ones at 0.25-0.35 s each, on a loaded 2-CPU machine); run without collections and
then frozen (`gc.freeze`), 0.1-0.2 s and 0.09 s. What the setup left as cyclic garbage is never freed (some 1,800
objects under MLflow's import): fine for a process that ends with its command, not for one that goes on (a
notebook's, a test's), where nothing changes.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def uncollected_setup(own_process: bool) -> Iterator[None]:
    """Within the block, no cyclic garbage collection; after it (whether or not it raised), every object the process
    holds is frozen (`gc.freeze`) and collections resume. Only where `own_process` (the process ends with the
    command: the supervised command's, the tracking process) and the collector was on; otherwise nothing changes."""
    if not own_process or not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        gc.enable()
