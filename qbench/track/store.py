"""The MLflow tracking store a recipe logs to, and its experiment. The runs themselves are qbench.track's.

The store: the recipe's `tracking.uri`, else $MLFLOW_TRACKING_URI, else a sqlite file in the working directory
(MLflow 3's plain `file:` store refuses to run without an opt-in). A sqlite store would put artifacts in ./mlruns
of whatever directory the process runs in, so qbench creates its experiments with an explicit artifact location
next to the database (`<db folder>/mlartifacts/<experiment>`), serialised when several sweeps create one at once;
`ui_command` serves the same root. Tracking servers (http/https) choose their own. HTTP retries are bounded, and
a store's failure is one line."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from mlflow.entities import Run
from mlflow.exceptions import MlflowException
from mlflow.protos.databricks_pb2 import RESOURCE_ALREADY_EXISTS, ErrorCode
from mlflow.tracking import MlflowClient
from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID
from sqlalchemy.exc import DBAPIError, SQLAlchemyError

from qbench.errors import QbenchError, one_line
from qbench.recipe.spec import Recipe
from qbench.runs import RUN_FOLDER_NAME, without_password
from qbench.track.system import PREFIX as SYSTEM_PREFIX
from qbench.track.uri import check_reachable, resolve_tracking_uri, sqlite_file, store_absent

try:  # POSIX; elsewhere concurrent first use of one new sqlite store is not serialised
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None  # type: ignore[assignment]

_ARTIFACT_FOLDER = "mlartifacts"
# The MLflow 3 UI opens an experiment in its model-training view (runs, models, charts) when this tag
# says so; without it, it infers the kind and may open the GenAI (traces) view.
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
TRAINING_KIND = "custom_model_development"
RUN_DIR_TAG = "qbench.run_dir"  # the sweep's run folder: `qbench gate --register` finds the runs by it
# What the store's libraries log on each failure, held back while qbench talks to the store (bounded_retries), up to
# this level: urllib3 logs each HTTP retry as a warning, MLflow's sqlite store each database error (a full disk) with
# its traceback, its model registry a line per version it waits on ("Waiting up to 300 seconds for model version to
# finish creation": qbench's line says what it registered).
_HELD_BACK = {"urllib3.connectionpool": logging.WARNING, "mlflow.store.db.utils": logging.ERROR,
              "mlflow.store.model_registry.abstract_store": logging.INFO}
FAILURE_CHARS = 400  # MLflow's own words in a failure's line: its connection errors run to several lines



def artifact_root(uri: str) -> str | None:
    """Where qbench puts artifacts for a sqlite store (a file URI next to the database); None for other stores."""
    database = sqlite_file(uri)
    return (database.parent / _ARTIFACT_FOLDER).as_uri() if database else None


def is_server(uri: str) -> bool:
    return uri.startswith(("http://", "https://"))


def now_ms() -> int:
    """This machine's clock in ms, as MLflow's client stamps runs and metrics."""
    return int(time.time() * 1000)


def end_time(run: Run) -> int:
    """When to end `run`, which another machine may have started: now, or its start where this machine's clock is
    behind that one's (MLflow would show a negative duration)."""
    return max(now_ms(), run.info.start_time or 0)


def after_logged(run: Run) -> tuple[int, int]:
    """The step and time stamp (ms) for figures logged again into `run` (a resumed sweep's summary, a later gate's
    count): after every figure it holds but its system metrics (steps of their own). MLflow shows a key's entry of the
    highest step, then the newest time stamp: logged at step 0 again, a figure from a machine whose clock is behind
    the one that logged first would stay hidden behind the figure it replaces, and the history would hold two
    entries at one step. The time is this machine's, or just after the newest entry where its clock is behind."""
    logged = [m for m in run.data.to_proto().metrics if not m.key.startswith(SYSTEM_PREFIX)]  # each key's latest
    if not logged:
        return 0, now_ms()
    return max(m.step for m in logged) + 1, max(now_ms(), max(m.timestamp for m in logged) + 1)


def search_literal(value: str) -> str:
    """`value` as a quoted string in an MLflow search filter."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _run_dir_filter(run_dir: Path) -> str:
    """Runs tagged with the run folder `run_dir` wherever it lay as its sweep logged them: a run folder keeps the name
    its sweep gave it (qbench.runs.RUN_FOLDER_NAME: the UTC second and 24 random bits) when it is uploaded as a CI
    artifact and gated, registered or tracked by a later job at another path, where its full path named no run (the
    gate tagged nothing, `--register` exited 2, 'the sweep was not tracked')."""
    if RUN_FOLDER_NAME.fullmatch(run_dir.name):
        return f"tags.`{RUN_DIR_TAG}` LIKE {search_literal('%' + run_dir.name)}"
    return f"tags.`{RUN_DIR_TAG}` = {search_literal(str(run_dir.resolve()))}"


def finished_sweep_run(client: MlflowClient, experiment_id: str, run_dir: Path) -> Run | None:
    """The newest FINISHED sweep run tagged with the run folder `run_dir`, if any (a sweep's runs are found by it)."""
    found = client.search_runs([experiment_id], f"{_run_dir_filter(run_dir)} and attributes.status = 'FINISHED'",
                               order_by=["attributes.start_time DESC"], max_results=1)  # fmt: skip
    return found[0] if found else None


def unfinished_sweep_runs(client: MlflowClient, experiment_id: str, run_dir: Path, *, keep: str = "") -> list[Run]:
    """The sweep (parent) runs tagged with `run_dir` that did not finish, other than `keep`: a sweep whose store went
    away while it logged leaves its run RUNNING (or FAILED, where the store still answered)."""
    return [run for run in client.search_runs([experiment_id], _run_dir_filter(run_dir))
            if run.info.run_id != keep and run.info.status != "FINISHED" and MLFLOW_PARENT_RUN_ID not in run.data.tags]


def experiment_name(recipe: Recipe) -> str:
    return recipe.tracking.experiment or recipe.name


def _experiment_id(client: MlflowClient, name: str, uri: str) -> str:
    existing = client.get_experiment_by_name(name)
    if existing is None:
        root = artifact_root(uri)
        folder = re.sub(r"[^\w.-]", "_", name)
        try:
            return client.create_experiment(
                name, artifact_location=f"{root}/{folder}" if root else None, tags={EXPERIMENT_KIND_TAG: TRAINING_KIND}
            )
        except MlflowException as exc:  # another sweep created it just now (a server store is not locked)
            existing = client.get_experiment_by_name(name)
            if exc.error_code != ErrorCode.Name(RESOURCE_ALREADY_EXISTS) or existing is None:
                raise
    if existing.lifecycle_stage == "deleted":
        raise QbenchError(
            f"MLflow experiment {name!r} in {without_password(uri)} is deleted: restore it in the MLflow UI, "
            "or set tracking.experiment in the recipe to another name"
        )
    if EXPERIMENT_KIND_TAG not in existing.tags:  # made before qbench set it; a kind set by the user is kept
        client.set_experiment_tag(existing.experiment_id, EXPERIMENT_KIND_TAG, TRAINING_KIND)
    return existing.experiment_id


@contextlib.contextmanager
def _store_lock(uri: str) -> Iterator[None]:
    """Serialise the first use of a sqlite store across processes (an exclusive lock on `<db>.lock`).

    MLflow creates and migrates a new sqlite database on first use, and two processes doing that at
    once fail; creating the experiment races the same way.
    """
    database = sqlite_file(uri)
    if database is None or fcntl is None:
        yield
        return
    database.parent.mkdir(parents=True, exist_ok=True)
    with open(f"{database}.lock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


# A tracking server that fails or stops answering must cost a sweep seconds, not MLflow's default back-off (7
# retries, minutes per call; the system-metrics thread's calls too): while qbench talks to a store, retries are these.
BOUNDED_RETRIES = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
                   "MLFLOW_HTTP_REQUEST_TIMEOUT": "30"}  # fmt: skip
_NO_RUN_URLS = "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"


@contextlib.contextmanager
def bounded_retries(uri: str = "") -> Iterator[None]:
    """MLflow's HTTP retries bounded by BOUNDED_RETRIES while the block runs; a variable the user set wins.

    With `uri`, the store the block talks to, holding a password: MLflow's "View run <name> at: <uri>/#/..." line,
    which it prints to stdout as each run ends (a CI log), is not printed, since it would spell the password.

    urllib3's warning for each retry ("Retrying (Retry(total=1, ...)) after connection broken by ...", a line per
    attempt of every call) and MLflow's error with a traceback for each failed database call of a sqlite store
    ("SQLAlchemy database error ... database or disk is full") are held back meanwhile (_HELD_BACK): a store that fails
    is qbench's one line naming it (store_failure), and one that answers after a retry needs no word."""
    wanted = BOUNDED_RETRIES | ({_NO_RUN_URLS: "true"} if without_password(uri) != uri else {})
    added = {name: value for name, value in wanted.items() if name not in os.environ}
    os.environ.update(added)
    held = {logging.getLogger(name): level for name, level in _HELD_BACK.items()}
    levels = {log: log.level for log in held}
    for log, level in held.items():
        log.setLevel(level + 1)
    try:
        yield
    finally:
        for log, level in levels.items():
            log.setLevel(level)
        for name in added:
            os.environ.pop(name, None)


def open_experiment(recipe: Recipe, uri: str | None = None) -> tuple[MlflowClient, str, str]:
    """A client of the recipe's store (or `uri`), the store's URI and the recipe's experiment id (created when new)."""
    uri = uri or resolve_tracking_uri(recipe)
    try:
        with _store_lock(uri), bounded_retries():
            client = MlflowClient(tracking_uri=uri)
            return client, uri, _experiment_id(client, experiment_name(recipe), uri)
    except (MlflowException, OSError, SQLAlchemyError) as exc:  # a database store's creation is not MLflow-wrapped
        raise QbenchError(store_failure(uri, exc)) from exc


def existing_experiment(recipe: Recipe, uri: str | None = None) -> tuple[MlflowClient, str, str] | None:
    """As `open_experiment`, but creating nothing: None where the recipe's sqlite store is no file yet or holds no
    live experiment of the recipe (what reads a sweep's runs, e.g. a later `qbench gate`, must not make a store in
    whatever folder CI runs it). A server that does not answer is a QbenchError in seconds. `uri`: another store."""
    uri = uri or resolve_tracking_uri(recipe)
    if store_absent(uri):
        return None
    check_reachable(uri)
    try:
        with bounded_retries():
            client = MlflowClient(tracking_uri=uri)
            found = client.get_experiment_by_name(experiment_name(recipe))
    except (MlflowException, OSError, SQLAlchemyError) as exc:
        raise QbenchError(store_failure(uri, exc)) from exc
    return (client, uri, found.experiment_id) if found is not None and found.lifecycle_stage == "active" else None


def ui_command(uri: str, host: str = "127.0.0.1", port: int = 5000) -> list[str]:
    """The `mlflow ui` command line that serves `uri`, with the artifact root qbench logs to for sqlite stores."""
    if is_server(uri):
        raise QbenchError(f"{uri} is a tracking server already: open it in a browser")
    database = sqlite_file(uri)
    store = f"sqlite:///{database.as_posix()}" if database else uri
    command = [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", store]
    root = artifact_root(uri)
    if root is not None:
        command += ["--default-artifact-root", root]
    return command + ["--host", host, "--port", str(port)]


def store_failure(uri: str, exc: BaseException) -> str:
    """What failed, in one line naming the store without the password its URI may hold (MLflow's connection errors run
    to several lines); a database's error is its driver's reason ("database or disk is full"), not the SQL statement
    it failed in."""
    database = _database_error(exc)
    if database is not None:
        message = str(database.orig)
    else:
        message = exc.message if isinstance(exc, MlflowException) else str(exc)
    return f"MLflow tracking at {without_password(uri)} failed: {one_line(message, FAILURE_CHARS)}"


def _database_error(exc: BaseException) -> DBAPIError | None:
    """The database driver's error behind `exc` (MLflow re-raises SQLAlchemy's as its own), if there is one."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, DBAPIError) and current.orig is not None:
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None
