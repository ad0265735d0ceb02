"""A sweep as a plan of jobs, computed before anything runs.

    build:<variant>               build the variant once (its files go to the build store)
    measure:<variant>@<backend>   accuracy and latency of the built variant on one backend

FP32 is built and measured first: `measure:fp32@<first backend>` gives the reference outputs every
other measurement is compared with, and `measure:fp32@<backend>` the reference accuracy of that
backend. A variant is measured once every variant before it is built, so one whose graph is identical
to an earlier variant's is reported from it rather than measured twice (as the local sweep always did).
A variant with `fallback` or `calibrator: auto`, and the recipe's INT8 search (`search:`, planned after
every variant), measure candidates while they build: their build needs the reference and the first
backend's device.

What a job needs (`JobNeeds`) comes from its backend: a GPU (optionally of one accelerator type) for
GPU backends, and the timing slot for every job that times a model, so no two timings share a node
(or a GPU); builds need one CPU.
"""

from __future__ import annotations

import functools
import hashlib
import json
import platform
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import qbench
from qbench.backends import BACKENDS
from qbench.backends.base import needs_gpu
from qbench.provenance import InputDigest
from qbench.recipe.spec import RUN_FIELDS, Recipe, VariantSpec
from qbench.techniques.base import BUILD_PACKAGES

JobKind = Literal["build", "measure"]
TIMING_RESOURCE = "qbench_timing"  # a custom resource: one unit per node (or GPU) that may time a model


@dataclass(frozen=True)
class JobNeeds:
    """What a job asks the cluster for."""

    gpu: bool = False
    accelerator: str | None = None
    timing: bool = False  # holds a timing slot: nothing else that times runs beside it

    def describe(self) -> str:
        device = f"GPU {self.accelerator}" if self.gpu and self.accelerator else "GPU" if self.gpu else "CPU"
        return f"{device} + timing slot" if self.timing else device


@dataclass(frozen=True)
class Job:
    id: str
    kind: JobKind
    variant: str
    backend: str | None  # measure jobs, and builds that search on the first backend
    needs: JobNeeds
    after: tuple[str, ...]  # ids of the jobs that must finish first
    build_key: str  # the content key of the variant's build (its folder in the build store)


@dataclass(frozen=True)
class SweepPlan:
    fingerprint: str  # of everything the jobs' results depend on: a resumed run must match it
    reference: str  # the FP32 variant's name
    backends: tuple[str, ...]
    jobs: tuple[Job, ...]

    def job(self, job_id: str) -> Job:
        return self._by_id()[job_id]

    def _by_id(self) -> dict[str, Job]:
        return {job.id: job for job in self.jobs}


def build_id(variant: str) -> str:
    return f"build:{variant}"


def measure_id(variant: str, backend: str) -> str:
    return f"measure:{variant}@{backend}"


def plan_fingerprint(recipe: Recipe, inputs: Mapping[str, InputDigest]) -> str:
    """Hash of the whole recipe but where results go and how jobs run (qbench.recipe.spec.RUN_FIELDS, field by field),
    of every input file, and of qbench."""
    exclude = {section: set(fields) if fields else True for section, fields in RUN_FIELDS.items()}
    payload = recipe.model_dump(mode="json", exclude=exclude)
    payload = {key: value for key, value in payload.items() if key not in RUN_FIELDS or value != {}}  # as before
    digest = hashlib.sha256(json.dumps({"qbench": qbench.__version__, "recipe": payload}, sort_keys=True).encode())
    for name, entry in sorted(inputs.items()):
        digest.update(f"{name}={entry.sha256}".encode())
    return digest.hexdigest()


def searches(recipe: Recipe, spec: VariantSpec) -> bool:
    """Whether building `spec` measures candidates (fallback, calibrator auto, the recipe's INT8 search)."""
    searched = recipe.search is not None and spec.name == recipe.search.name
    return searched or spec.fallback is not None or spec.calibrator == "auto"


def build_key(
    recipe: Recipe,
    spec: VariantSpec,
    inputs: Mapping[str, InputDigest],
    fingerprint: str,
) -> str:
    """The content key of a build: qbench (its version and its code), what it is built with (`build_facts`), the
    variant's spec, the model and data sections and every input file's digest; a searched build also depends on
    everything its search measures (the whole plan)."""
    payload = {
        "qbench": qbench.__version__,
        "qbench_code": qbench_code_digest(),
        "built_with": build_facts(recipe, spec),
        "spec": spec.model_dump(mode="json"),
        "task": recipe.task,
        "model": recipe.model.model_dump(mode="json"),
        "data": recipe.data.model_dump(mode="json"),
        "inputs": {name: entry.sha256 for name, entry in sorted(inputs.items())},
        "search": fingerprint if searches(recipe, spec) else None,
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:32]


def build_facts(recipe: Recipe, spec: VariantSpec) -> dict[str, str]:
    """What the build of `spec` computes with beyond its inputs, on this machine: the installed versions of the
    packages every build uses (BUILD_PACKAGES) and of its technique's `build_packages` (a PyTorch source adds torch,
    which exports the model), and the machine facts its technique reads (`machine_facts`). It is in the build's key,
    so an upgraded quantizer or another kind of CPU never reuses a build, nor replaces it in a shared store; a build
    records the facts of the machine that made it, and is reused only where they are the reader's
    (BuildStore.reusable: a cluster's workers may differ from the driver that keyed it). Read from package metadata:
    nothing is imported."""
    from qbench.environment import package_versions

    config = spec.technique_config
    source = ("torch",) if recipe.model.torch is not None else ()
    versions = package_versions(sorted({*BUILD_PACKAGES, *config.build_packages, *source}))
    # every build runs this CPU's kernels (calibration, range checks): its architecture is a fact of them all
    return {**versions, "machine": platform.machine(), **config.machine_facts()}


@functools.cache
def qbench_code_digest() -> str:
    """sha256 over qbench's own source files: a build made by other code (an edited checkout, a patched install of
    the same version) is never reused for this one."""
    root = Path(qbench.__file__).parent
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def backend_needs(recipe: Recipe, backend: str, *, timing: bool) -> JobNeeds:
    """What a job on `backend` needs: a GPU (of the recipe's pinned accelerator type) for GPU backends."""
    gpu = needs_gpu(BACKENDS.get(backend))
    pinned = recipe.backend_resources.get(backend)
    return JobNeeds(
        gpu=gpu,
        accelerator=pinned.accelerator if pinned and gpu else None,
        timing=timing,
    )


def make_plan(recipe: Recipe, inputs: Mapping[str, InputDigest]) -> SweepPlan:
    """Every job of the recipe's sweep, in the order the local executor runs them (but for the builds it starts first
    while the MLflow logging process is busy: qbench.execute.scheduler.Scheduler._start_ready)."""
    fingerprint = plan_fingerprint(recipe, inputs)
    specs = recipe.planned_variants()
    backends = tuple(recipe.backends)
    first = backends[0]
    reference = specs[0].name
    jobs: list[Job] = []
    earlier_builds: list[str] = []
    for spec in specs:
        key = build_key(recipe, spec, inputs, fingerprint)
        is_reference = spec.name == reference
        if searches(recipe, spec) and not is_reference:
            needs = backend_needs(recipe, first, timing=True)
            jobs.append(
                Job(
                    build_id(spec.name),
                    "build",
                    spec.name,
                    first,
                    needs,
                    (measure_id(reference, first),),
                    key,
                )
            )
        else:
            jobs.append(Job(build_id(spec.name), "build", spec.name, None, JobNeeds(), (), key))
        earlier_builds.append(build_id(spec.name))
        for backend in backends:
            after = list(earlier_builds)
            if not (is_reference and backend == first):
                after.append(measure_id(reference, first))
            if not is_reference and backend != first:
                after.append(measure_id(reference, backend))
            needs = backend_needs(recipe, backend, timing=True)
            jobs.append(
                Job(
                    measure_id(spec.name, backend),
                    "measure",
                    spec.name,
                    backend,
                    needs,
                    tuple(after),
                    key,
                )
            )
    return SweepPlan(fingerprint, reference, backends, tuple(jobs))
