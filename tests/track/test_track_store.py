"""A database tracking store that fails: one line naming the store and the database's reason, never the SQL."""

from __future__ import annotations

import contextlib
import os
import sqlite3
from pathlib import Path

import pytest
from mlflow.exceptions import MlflowException
from sqlalchemy.exc import OperationalError
from test_tracker import write_recipe

from qbench.errors import QbenchError
from qbench.track.store import open_experiment, store_failure


def test_a_sqlite_store_that_is_no_database_is_one_line_naming_it(tmp_path: Path) -> None:
    """MLflow creates (migrates) a sqlite store on first use and its errors there are SQLAlchemy's own, not
    MlflowException: before, a corrupt or full store crashed the sweep with the SQL statement it failed in."""
    database = tmp_path / "mlflow.db"
    database.write_text("not a database\n")
    uri = f"sqlite:///{database}"
    with pytest.raises(QbenchError) as raised:
        open_experiment(write_recipe(tmp_path, {"uri": uri}))
    assert str(raised.value) == f"MLflow tracking at {uri} failed: file is not a database"


def test_a_database_error_mlflow_rewraps_is_named_by_its_reason() -> None:
    """Mid-sweep, MLflow re-raises a full sqlite store's error as an MlflowException whose message holds the SQL and
    its parameters; the line names the driver's reason."""
    try:
        try:
            raise OperationalError("INSERT INTO metrics VALUES (?)", [("acc", 1.0)],
                                   sqlite3.OperationalError("database or disk is full"))  # fmt: skip
        except OperationalError as exc:
            raise MlflowException(message=exc) from exc  # as MLflow's session wrapper (mlflow.store.db.utils) does
    except MlflowException as wrapped:
        assert store_failure("sqlite:///m.db", wrapped) == ("MLflow tracking at sqlite:///m.db "
                                                            "failed: database or disk is full")


def _schema_and_version(database: Path) -> tuple[list[tuple[str, str, list[str]]], list[tuple[str, ...]]]:
    """Each table's, index's and trigger's name and statement (its lines in sorted order: MLflow's migrations write a
    table's constraints in an order that varies from run to run), and the schema version."""
    with contextlib.closing(sqlite3.connect(database)) as connection:
        rows = connection.execute("SELECT type, name, sql FROM sqlite_master ORDER BY type, name").fetchall()
        version = connection.execute("SELECT * FROM alembic_version").fetchall()
    return [(kind, name, sorted((sql or "").replace(", \n", "\n").splitlines())) for kind, name, sql in rows], version


@pytest.mark.skipif(os.name != "posix", reason="the tests' template store is made on POSIX only")
def test_the_tests_template_store_is_the_store_mlflow_migrates(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The tests fill each new sqlite store from a template made once per session (tests/conftest.py): a store so
    filled holds the tables, indexes and schema version MLflow's own migrations give a new store, and its first
    experiment is MLflow's default, which MLflow adds itself (the template holds none)."""
    from mlflow.store.db import utils
    from mlflow.tracking import MlflowClient

    filled, migrated = tmp_path / "filled" / "mlflow.db", tmp_path / "migrated" / "mlflow.db"
    [default] = MlflowClient(f"sqlite:///{filled}").search_experiments()
    monkeypatch.setattr(utils, "_initialize_tables", utils._initialize_tables.__wrapped__)  # MLflow's own
    MlflowClient(f"sqlite:///{migrated}").search_experiments()
    assert _schema_and_version(filled) == _schema_and_version(migrated)
    assert len(_schema_and_version(filled)[0]) > 20
    assert default.name == "Default" and default.experiment_id == "0"
