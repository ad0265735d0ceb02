"""A database tracking store that fails: one line naming the store and the database's reason, never the SQL."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from mlflow.exceptions import MlflowException
from sqlalchemy.exc import OperationalError
from test_track import write_recipe

from qbench.errors import QbenchError
from qbench.track_store import open_experiment, store_failure


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
        assert store_failure("sqlite:///m.db", wrapped) == "MLflow tracking at sqlite:///m.db failed: database or disk is full"
