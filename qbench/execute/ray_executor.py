"""The Ray executor: each job is a Ray task placed by what it needs (qbench.execute.plan.JobNeeds).

    build      num_cpus=1
    measure    num_cpus=1, num_gpus=1 on GPU backends (accelerator_type when the recipe pins one),
               and one unit of the `qbench_timing` custom resource: a node (or GPU) advertises as many
               units as timings it can run without disturbing each other, usually one

A measure task returns two objects: its result, fetched by the driver, and the evaluated outputs, which
stay in Ray's object store and are handed to the jobs that compare with them (only FP32's, the
reference, are fetched, to be recorded for a resume). Built models travel through the build store
(qbench.execute.store); a torch form that exists only in memory (QAT, ModelOpt) travels pickled.

Workers prepare the recipe's data themselves (once per worker process), from files they must reach:
on a cluster, the model, data and build store belong on storage every node mounts (or an fsspec URI
for the store). They read the sweep's snapshot of the inputs (qbench.execute.snapshot), never the
user's files as they are by then. Tasks are not retried by Ray (max_retries=0): a lost worker is reported to the
scheduler, which runs the job again within `executor.retries` and records the attempts. With `executor.timeout_s`, a
job still running that long on its worker fails there (JobTimedOut, a reason outside the variant) and its worker
process ends, so what hung in it (a native call, a stalled mount) holds no CPU or timing slot after.
While it waits for jobs, the driver checks that the cluster's head still accepts connections, and stops the sweep in
one line when it has not for a while (RayExecutor._check_head), before Ray's core would end the process unworded.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import replace
from typing import Any, TypeVar

from qbench.errors import QbenchError
from qbench.execute.executors import BuildWork, JobDone, MeasureWork, Work, import_ray
from qbench.execute.jobs import (
    BuildOutput,
    MeasureOutput,
    Outputs,
    fp32_reference,
    run_build,
    run_measure,
)
from qbench.execute.plan import TIMING_RESOURCE, Job, JobNeeds
from qbench.execute.store import BuildStore
from qbench.interrupt import Interrupted
from qbench.preflight.prepare import Prepared
from qbench.provenance import InputDigest
from qbench.recipe.spec import Recipe, VariantSpec
from qbench.results.schema import AccuracyResult

Inputs = Mapping[str, InputDigest]  # the input digests the driver recorded (qbench.provenance)

logger = logging.getLogger(__name__)

T = TypeVar("T")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")  # Ray's colour codes, in its tracebacks and messages
_PREPARED: dict[str, Prepared] = {}  # per worker process: recipe digest -> its prepared data


def _worker_prepared(recipe: Recipe, inputs: Inputs, store: BuildStore) -> Prepared:
    """The recipe's data, prepared once per worker process (destinations and backends are the driver's) from a
    snapshot of the inputs the driver hashed (qbench.execute.snapshot): the driver's copies when the store is
    a folder every node mounts, else this node's, checked against the same digests."""
    from qbench.execute.snapshot import take_snapshot
    from qbench.preflight.prepare import prepare
    from qbench.results.schema import canonical_sha256

    digests = {name: entry.sha256 for name, entry in inputs.items()}
    key = canonical_sha256({"recipe": recipe.model_dump(mode="json"), "source": str(recipe.source), "inputs": digests})
    if key not in _PREPARED:
        try:
            _PREPARED[key] = prepare(recipe, track=False, destinations=False, backends=False,
                                     snapshot=lambda: take_snapshot(inputs, store.sources_root))  # fmt: skip
        except OSError as exc:  # a node that does not mount what the driver's node does
            raise QbenchError(f"node {socket.gethostname()} cannot read the sweep's inputs: {exc.strerror or exc}: "
                              f"{exc.filename}; expected the recipe, its model and data files and the build store "
                              "at the same paths on every node (a shared mount, or baked into the image)") from exc
    return _PREPARED[key]


class JobTimedOut(QbenchError, TimeoutError):
    """A job still running on its worker after `executor.timeout_s` (a timeout: a reason outside the variant)."""


EXIT_AFTER_TIMEOUT_S = 2.0  # a timed-out job's worker ends this long after its failure is sent to the driver


def _within_timeout(timeout_s: float | None, run: Callable[[], T]) -> T:
    """`run()` on this worker, failed with JobTimedOut once it has run `timeout_s` seconds.

    The job runs in a thread of its own; past the timeout the task returns the failure and its worker, which runs
    one job only (RayExecutor: max_calls), exits; os._exit shortly after if it has not (what hangs in it cannot be
    stopped otherwise), so the hung call holds no CPU, memory or timing slot once the driver has its answer."""
    if timeout_s is None:
        return run()
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["value"] = run()
        except BaseException as exc:  # handed to the task's thread, raised there as the job's own
            outcome["error"] = exc

    job = threading.Thread(target=target, name="qbench-job", daemon=True)
    job.start()
    job.join(timeout_s)
    if job.is_alive():
        ending = threading.Timer(EXIT_AFTER_TIMEOUT_S, os._exit, (1,))
        ending.daemon = True
        ending.start()
        raise JobTimedOut(f"timed out: still running after executor.timeout_s = {timeout_s:g} s on node "
                          f"{socket.gethostname()} (its worker ended); `qbench sweep --resume` runs it again")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def _build_task(
    recipe: Recipe, inputs: Inputs, spec: VariantSpec, store: BuildStore, key: str, search_backend: str | None,
    reference_outputs: Outputs | None, reference_accuracy: AccuracyResult | None,
) -> BuildOutput:  # fmt: skip
    def build() -> BuildOutput:
        prepared = _worker_prepared(recipe, inputs, store)
        search = (search_backend, fp32_reference(reference_outputs, reference_accuracy)) if search_backend else None
        return run_build(spec, prepared, store, key, search)

    return _within_timeout(recipe.executor.timeout_s, build)


def _measure_task(
    recipe: Recipe,
    inputs: Inputs,
    work_bytes: bytes,
    store: BuildStore,
    reference_outputs: Outputs | None,
) -> tuple[MeasureOutput, Outputs | None]:
    return _within_timeout(recipe.executor.timeout_s,
                           lambda: _measure(recipe, inputs, work_bytes, store, reference_outputs))  # fmt: skip


def _measure(
    recipe: Recipe, inputs: Inputs, work_bytes: bytes, store: BuildStore, reference_outputs: Outputs | None
) -> tuple[MeasureOutput, Outputs | None]:
    import cloudpickle

    # first: a pickled torch form may need the user's module imported
    prepared = _worker_prepared(recipe, inputs, store)
    work: MeasureWork = cloudpickle.loads(work_bytes)
    if work.built.borrowed:  # the FP32 model itself: this node's snapshot of it
        built = replace(work.built, onnx_path=prepared.source.onnx_path)
    else:
        built = store.local_copy(work.built, work.key)
    done = run_measure(work.backend, built, prepared, fp32_reference(reference_outputs, work.reference_accuracy),
                       keep_outputs=True)  # fmt: skip
    return replace(done, outputs=None), done.outputs


def task_options(needs: JobNeeds) -> dict[str, Any]:
    """Ray's resource options for a job with `needs`."""
    options: dict[str, Any] = {"num_cpus": 1, "max_retries": 0}
    if needs.gpu:
        options["num_gpus"] = 1
        if needs.accelerator:
            options["accelerator_type"] = needs.accelerator
    if needs.timing:
        options["resources"] = {TIMING_RESOURCE: 1}
    return options


_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextmanager
def keeping_signal_handlers(*, hold: bool = False) -> Iterator[None]:
    """A Ray start or stop (`ray.init`, `ray.shutdown`) that leaves the process's SIGINT/SIGTERM handling as it was.

    Ray takes SIGTERM over twice: the driver's start-up installs its own handler (a bare sys.exit(SIGTERM)),
    and its core worker, when it stops, sets SIGTERM's action back to the default behind Python's back
    (signal.getsignal still names the sweep's handler, but a SIGTERM kills the process: no marker, no
    partial results, no exit code 2). After the block the process's handlers are installed again, the
    C-level action included. A SystemExit(SIGTERM) out of the block (Ray's handler took the signal) is
    given back as the signal itself, to the process's handler (the sweep's SignalGuard: an interruption).

    With `hold` (a stop), SIGINT and SIGTERM are blocked in this thread for the block, so one that comes
    while the default action is set waits, and reaches the process's handler after it. Not for a start:
    the processes Ray starts would inherit the block. Outside the main thread this does nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    kept = {signum: signal.getsignal(signum) for signum in _SIGNALS}
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNALS) if hold else None
    taken_by_ray = False
    try:
        yield
    except SystemExit as exc:
        taken_by_ray = exc.code == signal.SIGTERM
        raise
    finally:
        for signum, handler in kept.items():
            if handler is not None:
                signal.signal(signum, handler)
        if mask is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)  # a signal held meanwhile is handled here
        if taken_by_ray:
            signal.raise_signal(signal.SIGTERM)  # the process's handler decides (Interrupted under a SignalGuard)


def _wrapped_interruption(exc: BaseException) -> Interrupted | None:
    """The Interrupted `exc` wraps: a signal handled while Ray's extension runs (the sweep's SignalGuard raising
    Interrupted) comes out of it as a SystemError."""
    cause = exc.__cause__ or exc.__context__
    return cause if isinstance(exc, SystemError) and isinstance(cause, Interrupted) else None


def job_failed(job_id: str, exc: Exception) -> QbenchError:
    """The error a job raised on a worker (a Ray task error) as one line: a QbenchError's own message (the store
    full, say) rather than the worker's traceback."""
    cause = getattr(exc, "cause", None)
    if isinstance(cause, QbenchError):
        return QbenchError(f"job {job_id} failed on the cluster: {cause}")
    logger.debug("job %s failed on the cluster: %s", job_id, exc)  # the worker's traceback, for --verbose logs
    what = f"{type(cause).__name__}: {cause}" if isinstance(cause, BaseException) else str(exc)
    first = next((line.strip() for line in _ANSI.sub("", what).splitlines() if line.strip()), type(exc).__name__)
    return QbenchError(f"job {job_id} failed on the cluster: {first}")


@contextmanager
def unhandled_errors_ignored() -> Iterator[None]:
    """While connected, Ray's 'Unhandled error' tracebacks are off (its documented RAY_IGNORE_UNHANDLED_ERRORS): Ray
    logs a task's whole traceback when a failed result is dropped unread, and the driver reads every result it uses,
    so one dropped unread belongs to a job the sweep gave up on after reporting, in one line, the failure that
    stopped it (or a lost worker's outputs, the job run again). A value the user set is kept."""
    if "RAY_IGNORE_UNHANDLED_ERRORS" in os.environ:
        yield
        return
    os.environ["RAY_IGNORE_UNHANDLED_ERRORS"] = "1"
    try:
        yield
    finally:
        os.environ.pop("RAY_IGNORE_UNHANDLED_ERRORS", None)


CONNECT_SECONDS = 10.0  # how long a cluster's address may take to accept a connection before the sweep gives up
HEAD_CHECK_SECONDS = 5.0  # while no job ends, how often the driver checks that the cluster's head still answers
# how long the head may refuse connections before the sweep stops: short of Ray's own limit (its core ends the driver
# process after gcs_rpc_server_reconnect_timeout_s, 60 s by default, with no word of the sweep), long enough for a
# head with GCS fault tolerance to come back
HEAD_GONE_SECONDS = max(5.0, float(os.environ.get("RAY_gcs_rpc_server_reconnect_timeout_s", "60")) - 25.0)


# Ray's token authentication: `ray start` turns it on where a token exists (~/.ray/auth_token), and a driver joining by
# an explicit address sends none unless told to, so the head refuses it ('Unauthenticated' in Ray's log lines, a bare
# 'Failed to connect' in its error)
_AUTH_HINT = ("; if the cluster uses Ray's token authentication, set RAY_AUTH_MODE=token (with its token in "
              "RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH, or ~/.ray/auth_token) for the sweep")


def _accepts(address: str, timeout: float) -> bool:
    """Whether something accepts a TCP connection at `host:port` within `timeout` seconds."""
    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError:
        return False
    return True


def _check_reachable(address: str) -> None:
    """Refuse, in one line, a `host:port` (or `ray://host:port`) address where nothing accepts a connection.

    ray.init retries such an address without end (a head that is down, a wrong port: 'Failed to connect to GCS'
    every few seconds, for as long as one waits), so a sweep in CI would hang instead of failing. `auto` and
    other forms are left to Ray."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_SECONDS).close()
    except OSError as exc:
        raise QbenchError(f"executor.address: cannot join the Ray cluster at {address!r}: nothing accepted a "
                          f"connection at {host}:{port} within {CONNECT_SECONDS:g} s ({exc}); expected a running "
                          "Ray head (its GCS port, 6379 by default, or its client port for ray://)") from None


class RayExecutor:
    """Jobs as Ray tasks on the recipe's cluster (`executor.address`), or on a local one it starts and stops."""

    name = "ray"
    in_process = False  # a worker that dies is a lost worker, run again (`retries`)

    def __init__(self, recipe: Recipe, store: BuildStore, inputs: Inputs) -> None:
        self._ray: Any = import_ray()
        self._store = store
        self._owned = False  # a local cluster this executor started
        self._connected = False  # by this executor's ray.init: close() disconnects (and stops an owned cluster)
        self._results: dict[Any, str] = {}  # result ObjectRef -> job id
        self._outputs: dict[str, Any] = {}  # job id -> ObjectRef of its evaluated outputs
        self._keep: set[str] = set()
        self._messages = ExitStack()  # Ray's unhandled-error tracebacks off while this executor's connection lasts
        self._head: str | None = None  # the cluster's GCS address, checked while the driver waits (_check_head)
        self._head_checked = 0.0
        self._head_gone_since: float | None = None
        self._connect(recipe.executor.address)
        try:
            self._recipe_ref = self._ray.put(recipe)
            self._inputs_ref = self._ray.put(dict(inputs))
            # with a timeout, each job gets a fresh worker (Ray's max_calls): one ending after a timed-out job was
            # otherwise handed the next job in the meantime, lost with it
            remote = self._ray.remote(max_calls=1) if recipe.executor.timeout_s is not None else self._ray.remote
            self._build = remote(_build_task)
            self._measure = remote(_measure_task)
            cpus = int(self._ray.cluster_resources().get("CPU", 1))
        except BaseException:
            self.close()
            raise
        self.capacity = max(cpus * 4, 8)  # queued beyond the CPUs, so a freed CPU never waits for the driver

    def _connect(self, address: str | None) -> None:
        ray = self._ray
        if ray.is_initialized():
            return
        if address is None:  # a cluster of this machine alone, stopped when the sweep ends; "local": a new one even
            # where RAY_ADDRESS is set or another cluster runs here (ray.init would join it, and refuse num_cpus)
            options = {"address": "local", "num_cpus": os.cpu_count() or 1, "resources": {TIMING_RESOURCE: 1},
                       "include_dashboard": False}  # fmt: skip
        else:
            _check_reachable(address)
            options = {"address": address}
        try:
            with keeping_signal_handlers():
                ray.init(**options, log_to_driver=False, configure_logging=False)
        except BaseException as exc:
            self._disconnect()  # no half-started Ray left for the interpreter's exit to stop (seen crashing there)
            if address is not None and isinstance(exc, (ConnectionError, RuntimeError, ValueError)):
                raise QbenchError(f"executor.address: cannot join the Ray cluster at {address!r}: {exc}"
                                  f"{_AUTH_HINT if 'RAY_AUTH_MODE' not in os.environ else ''}") from None
            if (interrupted := _wrapped_interruption(exc)) is None:
                raise
            raise interrupted from None
        self._owned = address is None
        self._connected = True
        try:
            self._head = ray.get_runtime_context().gcs_address
        except Exception:  # noqa: BLE001 - a connection that reports no GCS address: Ray's own limit holds
            self._head = None
        self._messages.enter_context(unhandled_errors_ignored())

    def _disconnect(self) -> None:
        """ray.shutdown(), its signal handling kept (Ray's core resets SIGTERM to the default as it stops)."""
        with keeping_signal_handlers(hold=True):
            self._ray.shutdown()
        self._messages.close()

    def check_needs(self, needs: set[JobNeeds]) -> None:
        """Every kind of job must fit some node of the cluster, else it would wait forever: say what is missing."""
        have = self._ray.cluster_resources()
        for need in sorted(needs, key=lambda n: n.describe()):
            missing = []
            if need.gpu and have.get("GPU", 0) < 1:
                missing.append("a GPU")
            if need.accelerator and have.get(f"accelerator_type:{need.accelerator}", 0) <= 0:
                missing.append(f"a GPU of accelerator type {need.accelerator}")
            if need.timing and have.get(TIMING_RESOURCE, 0) < 1:
                missing.append(f"the custom resource {TIMING_RESOURCE!r} (start each node that may time models "
                               f"with --resources='{{\"{TIMING_RESOURCE}\": 1}}')")  # fmt: skip
            if missing:
                raise QbenchError(f"the Ray cluster has no node for jobs needing {need.describe()}: "
                                  f"it lacks {' and '.join(missing)}")  # fmt: skip

    def start(self, job: Job, work: Work) -> None:
        import cloudpickle

        options = task_options(job.needs)
        if isinstance(work, BuildWork):
            backend, reference = work.search if work.search else (None, None)
            ref = self._build.options(**options).remote(
                self._recipe_ref, self._inputs_ref, work.spec, self._store, work.key, backend,
                self._outputs.get(reference) if reference else None, work.reference_accuracy,
            )  # fmt: skip
            self._results[ref] = job.id
            return
        reference = self._outputs.get(work.reference_job) if work.reference_job else None
        result, outputs = self._measure.options(**options, num_returns=2).remote(
            self._recipe_ref, self._inputs_ref, cloudpickle.dumps(work), self._store, reference
        )
        self._results[result] = job.id
        self._outputs[job.id] = outputs
        if work.keep_outputs:
            self._keep.add(job.id)

    def record_with(self, record: Callable[[str, MeasureOutput], None]) -> None:
        """Nothing to do here: a worker's output reaches the driver through `next_done`, which records it."""

    def provide_outputs(self, job_id: str, outputs: Outputs) -> None:
        self._outputs[job_id] = self._ray.put(outputs)

    def next_done(self) -> JobDone:
        ray = self._ray
        ready = self._wait_one()
        job_id = self._results.pop(ready)
        try:
            output = ray.get(ready)
            if isinstance(output, MeasureOutput) and job_id in self._keep:
                output = replace(output, outputs=ray.get(self._outputs[job_id]))
        except ray.exceptions.RayTaskError as exc:  # the job itself raised past its own error handling
            if isinstance(getattr(exc, "cause", None), JobTimedOut):  # failed, not the sweep: the next jobs run
                self._outputs.pop(job_id, None)
                return JobDone(job_id, None, lost=str(exc.cause), retry=False)
            raise job_failed(job_id, exc) from None
        except ray.exceptions.RayError as exc:  # the worker or node died, the object was lost
            self._outputs.pop(job_id, None)
            return JobDone(job_id, None, lost=f"{type(exc).__name__}: {str(exc).splitlines()[0]}")
        return JobDone(job_id, output)

    def _wait_one(self) -> Any:
        """The next finished job's reference (an interruption while Ray waits raised as itself)."""
        while True:
            try:
                ready, _ = self._ray.wait(list(self._results), num_returns=1, timeout=1.0)
            except SystemError as exc:
                if (interrupted := _wrapped_interruption(exc)) is None:
                    raise
                raise interrupted from None
            if ready:
                return ready[0]
            self._check_head()

    def _check_head(self) -> None:
        """Stop the sweep in one line when the cluster's head (its GCS) has refused connections for HEAD_GONE_SECONDS:
        the jobs out are lost with it, and Ray's core would otherwise end this process a little later with its
        own log lines and exit status 1, which the sweep cannot word (`ray stop` on the head, its node or pod
        gone). What the run recorded stays, for `--resume` once the cluster is back."""
        now = time.monotonic()
        if self._head is None or now - self._head_checked < HEAD_CHECK_SECONDS:
            return
        self._head_checked = now
        if _accepts(self._head, timeout=2.0):
            self._head_gone_since = None
            return
        if self._head_gone_since is None:
            self._head_gone_since = now
        elif now - self._head_gone_since >= HEAD_GONE_SECONDS:
            raise QbenchError(f"the Ray cluster's head at {self._head} stopped: it accepted no connection for "
                              f"{now - self._head_gone_since:.0f} s while {len(self._results)} job(s) were out; "
                              "restart the cluster and run `qbench sweep --resume` to take up what was recorded")

    def where(self) -> str:
        nodes = [n for n in self._ray.nodes() if n.get("Alive")]
        cpus = self._ray.cluster_resources().get("CPU", 0)
        owner = "local Ray cluster" if self._owned else "Ray cluster"
        return f"{owner} of {len(nodes)} node{'s' if len(nodes) != 1 else ''}, {cpus:g} CPUs ({socket.gethostname()})"

    def close(self) -> None:
        """End the jobs still out and disconnect (stopping an owned cluster).

        Jobs are never cancelled with ray.cancel: a cancel, forced or not, of a task whose worker is just
        completing it marks the task failed at once, and the worker's reply arriving after makes Ray's core abort
        the driver process ('Check failed: ... Tried to complete task that was not pending', exit 1 with no
        message: a breach's exit code; seen in CI). Disconnecting ends them instead: an owned cluster stops with
        its workers, and a joined cluster's raylets end the workers of a job whose driver has gone. A sweep that
        found Ray already connected (a notebook's session) leaves its jobs to finish there, their results unused."""
        left = len(self._results)
        self._results.clear()
        self._outputs.clear()
        if not self._connected:
            if left:
                logger.info("%d job%s still out finish on the notebook's Ray session, their results unused",
                         left, "s" if left != 1 else "")  # fmt: skip
            return
        self._connected = False  # a joined cluster runs on; only this driver's connection (and its jobs) end
        self._disconnect()
