"""A new sqlite MLflow store filled from a template, in the tests' processes: the schema without the migrations.

MLflow makes a new sqlite store by running every migration of its schema (`_initialize_tables`: alembic, a commit and
an fsync each), about a second of CPU and several of wall time; each tracked sweep of the tests makes a new store, most
in processes of their own (`qbench` commands, the sweep's tracking process). Here the first store is made so
once per test session, as the template, and each later new store is given the template's schema and rows in one
transaction: the same tables, indexes, schema version and rows (no experiment: MLflow adds its default one itself).

Python imports this module as it starts in any process whose PYTHONPATH holds this folder (tests/conftest.py puts it
there and names the template's file in TEMPLATE_VARIABLE); the pytest process installs it itself. It touches only a
database with no table at all, takes the database's write lock before it looks, and otherwise leaves the call to
MLflow; nothing of MLflow is imported until the process imports MLflow's database module itself.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.abc
import importlib.machinery
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

TEMPLATE_VARIABLE = "QBENCH_TESTS_MLFLOW_TEMPLATE"
DATABASE_MODULE = "mlflow.store.db.utils"

_template_statements: list[str] = []


def install() -> None:
    """Fill new sqlite stores from the template named by TEMPLATE_VARIABLE, in this process (no-op without it, and
    where no file lock serialises the template's making: not POSIX)."""
    if not os.environ.get(TEMPLATE_VARIABLE) or os.name != "posix":
        return
    module = sys.modules.get(DATABASE_MODULE)
    if module is not None:
        _patch(module)
    elif not any(isinstance(finder, _PatchOnImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _PatchOnImport())


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Wraps the loader of MLflow's database module so that the module is patched as soon as it has run."""

    def find_spec(self, name: str, path: Sequence[str] | None, target: ModuleType | None = None) -> Any:
        if name != DATABASE_MODULE:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _PatchingLoader(spec.loader)
        return spec


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, loader: Any) -> None:
        self._loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        _patch(module)


def _patch(module: ModuleType) -> None:
    migrate = getattr(module, "_initialize_tables", None)
    if migrate is None or hasattr(migrate, "__wrapped__"):  # another MLflow's layout: its own migrations; or patched
        return

    @functools.wraps(migrate)
    def initialize_tables(engine: Any) -> None:
        database = engine.url.database if engine.dialect.name == "sqlite" else None
        if not database or database == ":memory:" or not _fill_if_empty(engine, _statements(migrate)):
            migrate(engine)

    module._initialize_tables = initialize_tables


def _statements(migrate: Callable[[Any], None]) -> list[str]:
    """The template's schema and rows as SQL statements; the template is made by `migrate` where it does not exist."""
    if not _template_statements:
        import sqlite3

        template = Path(os.environ[TEMPLATE_VARIABLE])
        _make_template(template, migrate)
        with contextlib.closing(sqlite3.connect(template)) as connection:
            _template_statements.extend(s for s in connection.iterdump() if s not in ("BEGIN TRANSACTION;", "COMMIT;"))
    return _template_statements


def _make_template(template: Path, migrate: Callable[[Any], None]) -> None:
    """MLflow's own new store at `template`, made by one process of all that may ask at once (a file lock)."""
    import fcntl

    import sqlalchemy

    with open(f"{template}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if template.exists():
            return
        made = template.with_name(f"{template.name}.{os.getpid()}")
        engine = sqlalchemy.create_engine(f"sqlite:///{made}")
        try:
            migrate(engine)
        finally:
            engine.dispose()
        os.replace(made, template)


def _fill_if_empty(engine: Any, statements: list[str]) -> bool:
    """Run `statements` in the engine's database in one transaction if it holds no table; whether it did."""
    connection = engine.raw_connection()
    database = connection.driver_connection
    isolation = database.isolation_level
    database.isolation_level = None  # the transaction is this function's own
    try:
        database.execute("BEGIN IMMEDIATE")
        try:
            empty = database.execute("SELECT count(*) FROM sqlite_master").fetchone()[0] == 0
            for statement in statements if empty else ():
                database.execute(statement)
        except BaseException:
            database.execute("ROLLBACK")
            raise
        database.execute("COMMIT")
        return empty
    finally:
        database.isolation_level = isolation
        connection.close()


install()
