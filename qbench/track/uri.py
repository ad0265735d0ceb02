"""Which MLflow store a recipe names, and whether it can hold runs at all, answered without importing MLflow (which
costs a second or two): `qbench gate` asks before it looks for a sweep's runs to tag (qbench.cli.gate)."""

from __future__ import annotations

import os
import urllib.parse
from pathlib import Path

from qbench.errors import QbenchError
from qbench.recipe.spec import Recipe
from qbench.runs import portable_store_uri, tracked_store, without_password


def resolve_tracking_uri(recipe: Recipe) -> str:
    """The recipe's tracking URI (a relative sqlite path is relative to the recipe), else $MLFLOW_TRACKING_URI,
    else `sqlite:///<absolute cwd>/mlflow.db`."""
    if recipe.tracking_uri:
        return recipe.tracking_uri
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return os.environ["MLFLOW_TRACKING_URI"]
    return "sqlite:///" + (Path.cwd() / "mlflow.db").as_posix()


def run_store_uri(recipe: Recipe, run_dir: Path) -> str:
    """The store holding the MLflow runs of the sweep saved in `run_dir`: the recipe's `tracking.uri` where it names
    one, else the store the sweep recorded logging to, else the default (`resolve_tracking_uri`). A later command
    reading them back (`qbench gate` tagging its verdict, registering the winner) may run in another working
    directory or environment, where the default store ($MLFLOW_TRACKING_URI, ./mlflow.db) is another. The record
    holds no password (runs.portable_store_uri): where it names the store this command's default names, that one
    (with its password) is used."""
    current = resolve_tracking_uri(recipe)
    recorded = None if recipe.tracking_uri else tracked_store(run_dir)
    return current if recorded is None or recorded == portable_store_uri(current) else recorded


def sqlite_file(uri: str) -> Path | None:
    """The database file of a sqlite URI (relative paths resolved against the cwd); None for other stores."""
    if not uri.startswith("sqlite:///"):
        return None
    return Path(uri.removeprefix("sqlite:///").split("?", 1)[0]).resolve()


def store_absent(uri: str) -> bool:
    """Whether `uri` names a local store that does not exist (a sqlite database that is no file, a file store's
    folder that is not there): it holds no runs, and opening it with MLflow would create it."""
    database = sqlite_file(uri)
    if database is not None:
        return not database.is_file()
    parsed = urllib.parse.urlparse(uri)
    if parsed.scheme == "file":
        from urllib.request import url2pathname  # here, not at the top: it imports http.client and ssl

        return not Path(url2pathname(parsed.path)).exists()
    return parsed.scheme == "" and not Path(uri).exists()


def check_reachable(uri: str, timeout_s: float = 5.0) -> None:
    """Fail fast when a tracking server does not answer (MLflow's own retries take minutes).

    A client error status is an answer: an auth proxy refusing a request without credentials (401, 403) stands before
    a server that MLflow's calls reach with theirs (a `user:password@` in the URI, MLFLOW_TRACKING_TOKEN, ...), and a
    refusal of those calls is MLflow's error, naming the status. The probe itself carries no credentials, and the
    URI's password is neither sent to a server's host name nor written in a message."""
    if not uri.startswith(("http://", "https://")):
        return
    from urllib.error import HTTPError, URLError
    from urllib.request import urlopen  # here, not at the top: a sweep logging to no server never needs http.client

    shown = without_password(uri)
    parsed = urllib.parse.urlsplit(uri)
    health = urllib.parse.urlunsplit(parsed._replace(netloc=parsed.netloc.rpartition("@")[2],
                                                     path=f"{parsed.path.rstrip('/')}/health"))  # fmt: skip
    try:
        with urlopen(health, timeout=timeout_s):
            return
    except HTTPError as exc:
        if exc.code < 500:
            return
        raise QbenchError(f"MLflow tracking server {shown} answers HTTP {exc.code} {exc.reason} (a proxy whose server "
                          "is down, or the server failing); start it or use --no-track") from None
    except (URLError, OSError, ValueError) as exc:  # ValueError: http.client's InvalidURL (a bad port)
        raise QbenchError(f"MLflow tracking server {shown} does not answer ({exc}); "
                          "start it or use --no-track") from None
