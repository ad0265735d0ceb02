"""The small contract every backend meets: check it can run here, load a variant, run, describe."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

from qbench.variants.base import ONNX, BuiltVariant


@dataclass(frozen=True)
class RunOptions:
    """How a backend should run a variant (from the recipe's `latency` section)."""

    threads: int | None = None
    batch_sizes: tuple[int, ...] = ()  # every batch size the runner will see (engine profiles are built for them)


@runtime_checkable
class Runner(Protocol):
    """A loaded variant, ready to run. One runner is alive at a time while timing.

    A runner whose `run` does per-call work that a deployment would not pay per inference (converting numpy inputs
    to its own tensors, its outputs back to numpy, entering a mode) may also offer
    `timed_calls(batches) -> ContextManager[list[Callable[[], object]]]`: one call per batch that runs only what a
    deployment runs, valid inside the context (see `timed_calls` below), and
    `served_call() -> ContextManager[Callable[[feeds], list[np.ndarray]]]`: what a server runs per request batch
    that arrives as numpy, its modes entered once for the serving thread (see `served_call` below)."""

    def run(self, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        """Run one batch; returns the model outputs in the model's output order."""
        ...

    def describe(self) -> dict[str, Any]:
        """What actually runs: runtime version, provider/device, threads, optimisation level."""
        ...

    def close(self) -> None:
        """Release the session (threads, memory)."""
        ...


@contextlib.contextmanager
def timed_calls(runner: Runner, batches: Sequence[Mapping[str, np.ndarray]]) -> Iterator[list[Callable[[], object]]]:
    """One zero-argument call per batch, each running that batch as the latency loops time it: the runner's own
    `timed_calls` where it has them (its inputs prepared and its modes entered before any clock starts), else its
    `run` (ONNX Runtime's run is the deployment's call: numpy in, numpy out)."""
    own = getattr(runner, "timed_calls", None)
    if own is None:
        yield [functools.partial(runner.run, batch) for batch in batches]
        return
    with own(batches) as calls:
        yield calls


ServedCall = Callable[[Mapping[str, np.ndarray]], Sequence[np.ndarray]]


@contextlib.contextmanager
def served_call(runner: Runner) -> Iterator[ServedCall]:
    """The call a server makes per batch of requests, valid inside the context, in the thread that entered it (a
    runner's modes, torch's inference mode and autocast, are per thread): the runner's own `served_call` where it has
    one, else its `run`. What it counts, as a server receiving numpy pays it per batch: the inputs converted to the
    runtime's tensors (dtype cast, copy to the device) and the outputs back to numpy (the answer it returns); what it
    does not count is what a server does once per worker (entering modes) and qbench's own bookkeeping for scoring.
    The cold start's first run and the real server's runs (qbench.validate.latency, qbench.validate.serve) are such
    calls; the steady-state loops time `timed_calls`, whose inputs are prepared before any clock starts."""
    own = getattr(runner, "served_call", None)
    if own is None:
        yield runner.run
        return
    with own() as call:
        yield call


@runtime_checkable
class Backend(Protocol):
    """A runtime. It may also declare `native_precisions` (a frozenset of precision names it computes
    with their own kernels); without it, every precision it accepts counts as native
    (see qbench.validate.fidelity). A backend whose jobs need a GPU declares `needs_gpu = True`
    (qbench.execute asks the cluster for one). A backend that runs a variant's torch module rather than its ONNX
    file declares `form = TORCH` (see `form_run_by`). `runtime_packages` names the distributions whose code computes
    its results (see `runtime_packages`). A backend may also offer `timed_load(variant, options) -> Callable[[],
    Runner]` (see `timed_load` below)."""

    name: str

    def check_available(self) -> None:
        """Raise MissingExtraError (naming the extra) if this backend's SDK or device is absent."""
        ...

    def supports(self, variant: BuiltVariant) -> str | None:
        """None if this backend can run `variant`, else the reason it cannot."""
        ...

    def load(self, variant: BuiltVariant, options: RunOptions) -> Runner:
        """Create a runner for the variant's model."""
        ...


def timed_load(backend: Backend, variant: BuiltVariant, options: RunOptions) -> Callable[[], Runner]:
    """The load the cold start times (qbench.validate.latency.measure_cold_start): the backend's own `timed_load`
    where it has one, which reads before any clock starts what a deployed server knows from its code rather than
    from the variant's files (the torch backend: the module's argument order, from the ONNX file), else its `load`."""
    own = getattr(backend, "timed_load", None)
    return own(variant, options) if own is not None else functools.partial(backend.load, variant, options)


def needs_gpu(backend: Backend | type[Backend]) -> bool:
    """Whether a job on `backend` (an instance or its class) must run where there is a GPU."""
    return bool(getattr(backend, "needs_gpu", False))


def native_precisions(backend: Backend) -> frozenset[str] | None:
    """The precisions `backend` computes natively; None when it declares none (all count as native)."""
    return getattr(backend, "native_precisions", None)


def form_run_by(backend: Backend | type[Backend]) -> str:
    """Which form of a variant `backend` runs, ONNX (its file; the default) or TORCH (its torch module): its results
    carry only the params and notes true of that form (BuiltVariant.as_run_in)."""
    return str(getattr(backend, "form", ONNX))


# distributions every measurement computes its figures with, whatever its backend: numpy feeds the rows and computes
# every metric (qbench.validate.metrics)
MEASURE_PACKAGES = ("numpy",)


def runtime_packages(backend: Backend | type[Backend]) -> tuple[str, ...]:
    """The distributions whose installed versions `backend`'s figures depend on (MEASURE_PACKAGES and its own
    `runtime_packages`): a resumed sweep measures again what another version measured (qbench.execute.resume)."""
    return (*MEASURE_PACKAGES, *getattr(backend, "runtime_packages", ()))
