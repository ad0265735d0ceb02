"""Hand the gate's winners to the MLflow Model Registry (the recipe's `registry:` section, or `--register NAME`).

Per backend (the section's `backends`, default all), the best passing variant is the fastest (p50)
at the primary batch size (`registry.primary_batch_size`, default the smallest latency batch size)
among the variants the gate judged and passed; variants within the timing noise of the fastest are
as fast, and the most accurate of them (then the first in the sweep) wins, so the pick never follows
noise. Each becomes a version of the registered model, made from the LoggedModel of that variant's
child run in the sweep's MLflow runs, and an alias points at it: `<alias>` at the primary backend's
(the recipe's first backend with a winner), and with several backends also `<alias>-<backend>` at each
backend's (e.g. `candidate-ort-cpu`). Only a passing gate (exit 0) registers anything; the sweep's runs
are found by the run folder the tracker tagged its parent run with.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from mlflow.entities import Run
from mlflow.entities.model_registry import ModelVersion
from mlflow.exceptions import MlflowException
from mlflow.protos.databricks_pb2 import RESOURCE_ALREADY_EXISTS, ErrorCode
from mlflow.tracking import MlflowClient
from mlflow.tracking._tracking_service.utils import _use_tracking_uri

from qbench.errors import QbenchError, one_line
from qbench.frontier.pareto import faster_beyond_noise, overall_metric, timed_on, timing_margin
from qbench.gate.evaluate import GateReport
from qbench.recipe.registry import RegistrySpec
from qbench.recipe.spec import Recipe
from qbench.results.schema import LatencyPoint, SweepResults, VariantResult
from qbench.runs import without_password
from qbench.track.content import short_backend
from qbench.track.store import (
    FAILURE_CHARS,
    bounded_retries,
    finished_sweep_run,
    open_experiment,
    search_literal,
    unfinished_sweep_runs,
)
from qbench.track.uri import run_store_uri
from qbench.validate.catalogue import METRICS
from qbench.validate.contention import contended


@dataclass(frozen=True)
class Registration:
    """One registered model version: which variant on which backend, from which run, under which aliases."""

    name: str
    version: str
    variant: str
    backend: str
    run_id: str
    model_id: str
    aliases: tuple[str, ...]
    existing: bool = False  # the model was this version already (registering the same results again)


def best_passing(results: SweepResults, gate: GateReport, batch_size: int,
                 backends: Collection[str]) -> dict[str, VariantResult]:  # fmt: skip
    """Backend (of `backends`) -> the variant that passed the gate with the lowest p50 at `batch_size` (backends in
    sweep order): of those within the timing noise of the lowest, the one with the best gate metric, then the first.
    A point timed beside other processes' load (qbench.validate.contention) is within the noise of every other.

    Raises QbenchError when one backend's passing variants were timed on more than one kind of machine (a cluster's
    nodes): the lowest p50 there would pick the fastest machine, not the fastest variant."""
    passing: dict[str, list[tuple[VariantResult, LatencyPoint]]] = {}
    kinds: dict[str, dict[str, list[str]]] = {}  # backend -> machine kind -> its passing variants
    for variant in results.variants:
        point = variant.latency.at(batch_size) if variant.latency is not None else None
        if (point is None or variant.backend not in backends or variant.variant == results.reference
                or gate.status_of(variant.variant, variant.backend) != "pass"):  # FP32 is the baseline, never a winner
            continue
        passing.setdefault(variant.backend, []).append((variant, point))
        kinds.setdefault(variant.backend, {}).setdefault(timed_on(variant), []).append(variant.variant)
    for backend, by_kind in kinds.items():
        if len(by_kind) > 1:
            where = "; ".join(f"{', '.join(names)} on "
                              f"{kind or 'an unrecorded machine'}" for kind, names in by_kind.items())
            raise QbenchError(f"cannot tell the fastest passing variant on {backend}: its variants were timed on "
                              f"{len(by_kind)} kinds of machine ({where}); time every variant of a backend on one "
                              "kind of node; nothing registered")  # fmt: skip
    sign = 1.0 if METRICS[results.gate_metric].higher_is_better else -1.0

    def score(variant: VariantResult) -> float:
        value = sign * overall_metric(variant, results.gate_metric)
        return value if math.isfinite(value) else -math.inf

    best: dict[str, VariantResult] = {}
    for backend, found in passing.items():
        _, fastest = min(found, key=lambda entry: entry[1].p50_ms)
        loaded = any(contended(p) for _, p in found)
        as_fast = [v for v, p in found if not faster_beyond_noise(fastest.p50_ms, p.p50_ms,
                                                                  timing_margin(fastest.spread, p.spread,
                                                                                contended=loaded))]  # fmt: skip
        best[backend] = max(as_fast, key=score)  # the first of equal scores
    return best


def _sweep_children(client: MlflowClient, experiment_id: str, run_dir: Path, uri: str) -> dict[str, Run]:
    """variant@backend -> child run of the newest finished MLflow sweep run tagged with `run_dir`."""
    shown = without_password(uri)
    parent = finished_sweep_run(client, experiment_id, run_dir)
    if parent is None and (left := unfinished_sweep_runs(client, experiment_id, run_dir)):
        raise QbenchError(
            f"the MLflow logging of {run_dir}'s sweep did not finish (its store failed while it ran: sweep run "
            f"{left[0].info.run_id} is {left[0].info.status}) in {shown}; log the folder with `qbench track <recipe> "
            "<run folder>`; nothing registered")  # fmt: skip
    if parent is None:
        raise QbenchError(
            f"no finished MLflow sweep run for {run_dir} in {shown}: the sweep was not tracked (--no-track) "
            "or logged elsewhere (log it with `qbench track <recipe> <run folder>`); nothing registered"
        )
    children = client.search_runs([experiment_id], f"tags.mlflow.parentRunId = {search_literal(parent.info.run_id)}")
    return {f"{r.data.tags.get('qbench.variant')}@{r.data.tags.get('qbench.backend')}": r for r in children}


def _model_id(client: MlflowClient, run: Run, key: str) -> str:
    """The LoggedModel the child run of `key` output (its variant's model)."""
    outputs = client.get_run(run.info.run_id).outputs
    models = outputs.model_outputs if outputs is not None else []
    if not models:
        raise QbenchError(f"the MLflow run of {key} ({run.info.run_id}) has no logged model; nothing registered")
    return models[0].model_id


def _ensure_registered_model(client: MlflowClient, name: str) -> bool:
    """Create the registered model `name` unless it exists; whether it was created now."""
    try:
        client.create_registered_model(name, description="qbench: the best variant that passed the gate, per backend")
    except MlflowException as exc:
        if exc.error_code != ErrorCode.Name(RESOURCE_ALREADY_EXISTS):
            raise
        return False
    return True


def _source(model_id: str) -> str:
    """A version's source for a LoggedModel (what the registry records: a version's model_id may read None)."""
    return f"models:/{model_id}"


def _version_of(client: MlflowClient, name: str, run_id: str, model_id: str) -> ModelVersion | None:
    """The version of `name` that already holds this run's logged model, if any: registering the same results again
    (a retried CI job) moves the aliases to it instead of adding a copy."""
    found = client.search_model_versions(f"name = {search_literal(name)} and run_id = {search_literal(run_id)}")
    return min((v for v in found if v.source == _source(model_id)), key=lambda v: int(v.version), default=None)


def _aliases(alias: str, backends: list[str]) -> dict[str, list[str]]:
    """Backend -> its aliases: `alias` for the first, `alias-<short backend>` for each when there are several."""
    named = {backend: [f"{alias}-{short_backend(backend)}"] if len(backends) > 1 else [] for backend in backends}
    if backends:
        named[backends[0]].insert(0, alias)
    return named


def register_best(
    recipe: Recipe, results: SweepResults, gate: GateReport, run_dir: Path, spec: RegistrySpec
) -> list[Registration]:
    """Register each backend's best passing variant as a version of `spec.model` and point the aliases at them.

    Raises QbenchError (and registers nothing) when the gate did not pass or the sweep's runs,
    or one winner's logged model, cannot be found.
    """
    name, alias = spec.model, spec.alias
    if gate.exit_code != 0:
        raise QbenchError(f"the gate did not pass (exit {gate.exit_code}): nothing registered, no alias moved")
    batch_size = spec.batch_size(recipe.latency.batch_sizes)
    wanted = spec.backends if spec.backends is not None else recipe.backends
    winners = best_passing(results, gate, batch_size, wanted)
    if not winners:
        raise QbenchError(f"no variant passed the gate with a latency at batch size {batch_size} on "
                          f"{', '.join(wanted)}: nothing registered")  # fmt: skip
    client, uri, experiment_id = open_experiment(recipe, run_store_uri(recipe, run_dir))
    created, registered = False, list[Registration]()
    with bounded_retries():  # a failing registry costs seconds, not MLflow's minutes of back-off per call
        try:
            children = _sweep_children(client, experiment_id, run_dir, uri)
            sources = {}
            for backend, variant in winners.items():  # every winner's model found before anything is registered
                run = children.get(variant.key)
                if run is None:
                    raise QbenchError(f"no MLflow run of {variant.key} under the "
                                      f"sweep run of {run_dir}; nothing registered")
                sources[backend] = (run.info.run_id, _model_id(client, run, variant.key))
            created = _ensure_registered_model(client, name)
            aliases = _aliases(alias, [b for b in results.backends() if b in winners])
            for backend, variant in winners.items():
                run_id, model_id = sources[backend]
                p50_ms = variant.latency.at(batch_size).p50_ms  # type: ignore[union-attr]
                tags = {"qbench.variant": variant.variant, "qbench.backend": backend, "qbench.gate": "pass",
                        f"qbench.p50_ms.b{batch_size}": f"{p50_ms:.4g}"}
                # a local registry store looks a `models:/` source up through MLflow's global tracking URI (its own
                # TODO), not this client's: with the recipe's store elsewhere than the default, set it while registering
                version = None if created else _version_of(client, name, run_id, model_id)
                existing = version is not None
                if version is None:
                    with _use_tracking_uri(uri):
                        version = client.create_model_version(name, _source(model_id), run_id=run_id, tags=tags,
                                                              model_id=model_id)  # fmt: skip
                else:  # the tags say what this registration judged (e.g. another primary batch size)
                    for key, value in tags.items():
                        client.set_model_version_tag(name, version.version, key, value)
                for each in aliases[backend]:
                    client.set_registered_model_alias(name, each, version.version)
                registered.append(Registration(name, str(version.version), variant.variant, backend, run_id, model_id,
                                               tuple(aliases[backend]), existing))  # fmt: skip
        except (MlflowException, OSError) as exc:  # OSError: requests' connection errors
            if created and not registered:  # nothing registered means nothing left behind, not an empty model
                with contextlib.suppress(MlflowException, OSError):
                    client.delete_registered_model(name)
            message = exc.message if isinstance(exc, MlflowException) else str(exc)
            raise QbenchError(f"registering {name!r} in {without_password(uri)} failed: "
                              f"{one_line(message, FAILURE_CHARS)}") from exc
    return registered
