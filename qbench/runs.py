"""Run folders of a recipe: <output_dir>/<name>/<UTC time>-<suffix>/, each marked INCOMPLETE until its sweep ends.

A sweep creates its folder with an `INCOMPLETE` marker (JSON: when it started, its state) and
removes the marker only after the complete results.json is written. An interrupted or crashed
sweep leaves the marker (state "interrupted by SIGTERM", "failed: ...") next to whatever it wrote.

A sweep also records in `tracking.json` whether it logs to MLflow (`qbench track` records it as it logs the folder
after the fact): `qbench gate` looks for the folder's runs in a store only where they may be.

The newest run is chosen by the times recorded in the files, never by folder names: a complete
run counts from its results' `finished_at`, an incomplete one from the marker's `started_at`.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import socket
import urllib.parse
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from qbench.errors import QbenchError
from qbench.files import folder_writes, write_atomically
from qbench.supervisor import supervised

INCOMPLETE_MARKER = "INCOMPLETE"
RESULTS_FILE = "results.json"
TRACKING_FILE = "tracking.json"
RUN_FOLDER_NAME = re.compile(r"\d{8}-\d{6}-[0-9a-f]{6}")  # new_run_dir's names: <UTC time>-<6 hex digits>


@dataclass(frozen=True)
class RunFolder:
    path: Path
    recorded_at: datetime  # complete: when its results were finished; incomplete: when its sweep started
    complete: bool
    state: str  # "complete", or the marker's state ("running", "interrupted by SIGINT", "failed: ...")
    # the recipe file whose sweep wrote the folder where it lies now; None where not recorded (an older qbench's) or
    # where the folder was moved or copied here since (a CI artifact, a checkout at another path)
    written_by: Path | None = None


def utc_now() -> str:
    """The current UTC time as ISO 8601 with microseconds (sweeps started in the same second still order)."""
    return datetime.now(timezone.utc).isoformat(timespec="microseconds")


def new_run_dir(root: Path, recipe_file: Path | None = None) -> Path:
    """A fresh folder <root>/<UTC time>-<random suffix>, created exclusively and marked INCOMPLETE (running) by the
    sweep of `recipe_file`."""
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    folder = root / f"{stamp}-{secrets.token_hex(3)}"  # RUN_FOLDER_NAME
    try:
        root.mkdir(parents=True, exist_ok=True)
        folder.mkdir(exist_ok=False)  # a name collision is an error, never a shared folder
        _write_marker(folder, {"started_at": utc_now(), "state": "running", "pid": os.getpid(),
                               "host": socket.gethostname(), "supervised": supervised(), "folder": str(folder),
                               "recipe": None if recipe_file is None else str(recipe_file)})  # fmt: skip
    except OSError as exc:
        raise QbenchError(f"cannot create the run folder {folder}: {exc.strerror or exc}; expected output_dir and "
                          f"{root.name}/ in it writable") from exc  # fmt: skip
    return folder


def where_now(recorded: str, run_folder: Path) -> str:
    """`recorded`, the absolute path of a file a sweep wrote into its own run folder (a variant's model), where that
    file is now that the run folder is `run_folder`: a run folder uploaded as a CI artifact and gated in a later job,
    or a checkout at another path, holds the file under its new path, not the recorded one. A path outside a run
    folder of `run_folder`'s name (an input's copy in the build store), or a `run_folder` that is no run folder's
    name (results.json copied out alone), is kept as recorded."""
    parts = Path(recorded).parts
    if not RUN_FOLDER_NAME.fullmatch(run_folder.name) or run_folder.name not in parts:
        return recorded
    inside = parts[len(parts) - parts[::-1].index(run_folder.name):]
    return str(run_folder.joinpath(*inside))


def run_folder_writes(folder: Path) -> AbstractContextManager[None]:
    """A full, read-only or refusing file system under the run `folder` met inside (copying a build's files in, say)
    is one line naming the folder, not a crash (qbench.files.folder_writes); the sweep then marks the run
    incomplete as it can."""
    return folder_writes(folder, lambda exc: QbenchError(
        f"cannot write to the run folder {folder}: {exc.strerror or exc}; free space there or set output_dir to a "
        "writable folder"))  # fmt: skip


def mark_incomplete(folder: Path, state: str) -> None:
    """Record why the sweep in `folder` did not finish (keeps the marker's start time)."""
    _write_marker(folder, _read_marker(folder) | {"state": state, "ended_at": utc_now()})


def mark_complete(folder: Path) -> None:
    """The sweep's complete results are written: remove the marker."""
    (folder / INCOMPLETE_MARKER).unlink(missing_ok=True)


def record_tracking(folder: Path, logged: bool, uri: str | None = None) -> None:
    """Whether `folder` may be in an MLflow store: its sweep logs it there (a store that fails meanwhile leaves it
    true), or `qbench track` is about to log it after the fact; `uri`: that store, resolved as it logs there (a
    default one depends on the working directory and the environment of that command, not of a later one)."""
    content = {"mlflow": logged} | ({"uri": portable_store_uri(uri)} if logged and uri else {})
    write_atomically(folder / TRACKING_FILE, json.dumps(content) + "\n", what="the run's tracking record")


def may_be_tracked(folder: Path) -> bool:
    """False only where `folder` records that it was never logged to MLflow; one that records nothing (an older
    qbench's run folder, results copied elsewhere) may have been."""
    return _tracking(folder).get("mlflow") is not False


def portable_store_uri(uri: str) -> str:
    """`uri` as a run folder records it: a local store's relative path made absolute (MLflow resolves it against the
    working directory of the sweep, which a later command need not share), and a password in it left out (a run
    folder is a CI artifact; qbench.track.uri.run_store_uri takes the password back from the store the later command
    names)."""
    if uri.startswith("sqlite:///"):
        path, separator, query = uri.removeprefix("sqlite:///").partition("?")
        return "sqlite:///" + Path(path).resolve().as_posix() + separator + query if path else uri
    parsed = urllib.parse.urlsplit(uri)
    if parsed.scheme == "file" and not parsed.netloc:
        from urllib.request import url2pathname  # only here: it imports http.client and ssl, needed nowhere else

        return Path(url2pathname(parsed.path)).resolve().as_uri()
    if parsed.scheme == "" and uri != "databricks":  # MLflow's word for the Databricks workspace, no folder
        return Path(uri).resolve().as_posix()
    return without_password(uri)


def without_password(uri: str) -> str:
    """`uri` without the `user:password@` it may hold, as a run folder records it and a message names it."""
    parsed = urllib.parse.urlsplit(uri)
    if parsed.password is None:
        return uri
    return urllib.parse.urlunsplit(parsed._replace(netloc=parsed.netloc.rpartition("@")[2]))


def tracked_store(folder: Path) -> str | None:
    """The MLflow store `folder`'s sweep was logged to, as recorded then (None: not recorded, an older qbench's)."""
    uri = _tracking(folder).get("uri")
    return uri if isinstance(uri, str) and uri else None


def _tracking(folder: Path) -> dict[str, object]:
    return _json_object(folder / TRACKING_FILE)


def ran_supervised(folder: Path) -> bool:
    """Whether the sweep of the incomplete run `folder` ran in the child of a supervising `qbench` process, which
    records how that child ended unless it was killed itself (qbench.supervisor); False for a marker that does not
    say (an older qbench's) and for a finished run."""
    return _read_marker(folder).get("supervised") is True


def _write_marker(folder: Path, content: dict[str, object]) -> None:
    write_atomically(folder / INCOMPLETE_MARKER, json.dumps(content, indent=2) + "\n", what="the run's marker")


def _read_marker(folder: Path) -> dict[str, object]:
    return _json_object(folder / INCOMPLETE_MARKER)


def _json_object(path: Path) -> dict[str, object]:
    """The JSON object a run's record file holds; {} where it is missing, unreadable or not an object (an older
    qbench's folder, a write cut short): each reader treats that as "not recorded"."""
    try:
        content = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return content if isinstance(content, dict) else {}


def _marker_state(content: dict[str, object]) -> str:
    """The marker's state; a "running" sweep whose process is gone from this host was killed (SIGKILL, OOM, power)
    without the chance to say so."""
    state = str(content.get("state", "unknown"))
    pid = content.get("pid")
    if state == "running" and content.get("host") == socket.gethostname() and isinstance(pid, int) and not _alive(pid):
        return f"killed: its sweep (pid {pid}) ended without finishing"
    return state


def running_here(folder: Path) -> int | None:
    """The pid of another live process of this host whose sweep is still writing `folder` (its marker says running),
    else None. Such a run is not interrupted: its jobs in progress are marked started with no record yet, which a
    resume would read as jobs its process died running. A run marked running on another host cannot be told from one
    killed there (None)."""
    content = _read_marker(folder)
    pid = content.get("pid")
    if (content.get("state") != "running" or content.get("host") != socket.gethostname() or not isinstance(pid, int)
            or pid == os.getpid() or not _alive(pid)):  # fmt: skip
        return None
    return pid


def _alive(pid: int) -> bool:
    """Whether process `pid` still runs. A zombie does not: it ended, and waits for a parent to reap it, which a killed
    parent never does, nor a container's first process that reaps nothing (a CI job's container without an init), so a
    killed sweep's pid answers signals for as long as the container lives."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        pass
    return not _zombie(pid)


def _zombie(pid: int) -> bool:
    """Whether `pid` has ended and awaits its reaping (Linux's /proc; False where that cannot be read)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[:1] == ["Z"]


def _parse_time(value: object) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)


def _file_time(path: Path) -> datetime:
    return datetime.fromtimestamp(path.stat().st_mtime, timezone.utc)


def describe_run(folder: Path) -> RunFolder | None:
    """What `folder` holds: None when it is no run folder (neither marker nor results.json)."""
    marker, results = folder / INCOMPLETE_MARKER, folder / RESULTS_FILE
    if marker.is_file():
        content = _read_marker(folder)
        started = _parse_time(content.get("started_at")) or _file_time(marker)
        written_by = content.get("recipe") if _same_folder(content.get("folder"), folder) else None
        return RunFolder(folder, started, complete=False, state=_marker_state(content),
                         written_by=Path(written_by) if isinstance(written_by, str) else None)  # fmt: skip
    if not results.is_file():
        return None
    try:
        raw = json.loads(results.read_text())
    except (OSError, ValueError):
        raw = None
    if not isinstance(raw, dict):  # unreadable: the gate will say so when it reads the file
        return RunFolder(folder, _file_time(results), complete=True, state="complete")
    recorded = _parse_time(raw.get("finished_at")) or _parse_time(raw.get("created_at")) or _file_time(results)
    written_by = _results_writer(raw.get("recipe"), folder)
    if raw.get("complete", True) is not True:
        return RunFolder(folder, recorded, complete=False, state="incomplete results", written_by=written_by)
    return RunFolder(folder, recorded, complete=True, state="complete", written_by=written_by)


def _same_folder(recorded: object, folder: Path) -> bool:
    return isinstance(recorded, str) and Path(recorded).resolve() == folder.resolve()


def _results_writer(record: object, folder: Path) -> Path | None:
    """The recipe file results.json records (its `recipe.path`) where its output_dir, as that file resolved it, is the
    folder the run lies in now; None otherwise."""
    if not isinstance(record, dict) or not isinstance(record.get("path"), str):
        return None
    resolved = record.get("resolved")
    output_dir = resolved.get("output_dir") if isinstance(resolved, dict) else None
    name = record.get("name")
    if not isinstance(output_dir, str) or not isinstance(name, str):
        return None
    recipe_file = Path(record["path"])
    written_in = recipe_file.parent / output_dir / name
    return recipe_file if _same_folder(str(written_in), folder.parent) else None


def run_folders(root: Path) -> list[RunFolder]:
    """The run folders under `root`, complete or not."""
    folders = [folder for folder in root.iterdir() if folder.is_dir()] if root.is_dir() else []
    return [run for run in map(describe_run, folders) if run is not None]


def newest_run(runs: list[RunFolder]) -> RunFolder | None:
    """The run with the latest recorded time; None when there is none."""
    return max(runs, key=lambda run: (run.recorded_at, run.path.name), default=None)


def of_another_checkout(run: RunFolder, recipe_file: Path) -> bool:
    """Whether `run` was written where it lies by the sweep of a recipe file of `recipe_file`'s name in another folder
    that is still on this machine: another checkout of the project whose recipe writes to the same folder (two CI
    jobs at once on one runner, an absolute output_dir). Its results answer for that checkout's inputs, not for this
    one's. A run folder moved or copied since (a CI artifact downloaded, a checkout elsewhere), one whose recipe file
    is gone, or one of another recipe file beside this one may be this recipe's (the gate checks which)."""
    if run.written_by is None or run.written_by.name != recipe_file.name:
        return False
    try:
        return run.written_by.is_file() and not run.written_by.samefile(recipe_file)
    except OSError:
        return False
