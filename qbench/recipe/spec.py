"""The recipe: a YAML file that names the model, the data, the variants, the backends and the gate.

Every default lives on these models. `load_recipe` parses and checks the schema
and the files the recipe names; checks that need the data or the model opened
(columns, filters, input names) are in `qbench.preflight`.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import (
    Field,
    JsonValue,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

from qbench.errors import RecipeError, expected_one_of, short_repr
from qbench.recipe.data import DataSpec, path_field
from qbench.recipe.errors import recipe_error
from qbench.recipe.executor import BackendResources, ExecutorSpec, check_backend_resources, split_backend_entries
from qbench.recipe.gate import GateSpec
from qbench.recipe.metrics import MetricSpec, check_metrics, custom_metric_infos, default_gate_metric
from qbench.recipe.registry import RegistrySpec, check_registry
from qbench.recipe.search import SearchSpec, check_search, check_search_batches
from qbench.recipe.slo import CostSpec, SloSpec, check_serving
from qbench.recipe.strict_yaml import read_recipe_yaml
from qbench.recipe.variants import Name, VariantSpec, check_case_apart, reference_variant
from qbench.techniques.options import (
    FallbackSpec,
    QatSpec,
    SmoothQuantSpec,
    TrainSpec,
)
from qbench.techniques.options import StrictConfig as _Strict

if TYPE_CHECKING:
    from collections.abc import Mapping

    from qbench.provenance import InputDigest
    from qbench.validate.catalogue import MetricInfo

# the variant and technique option models, importable from here as before
__all__ = ["FallbackSpec", "QatSpec", "Recipe", "SmoothQuantSpec", "TrainSpec", "VariantSpec", "load_recipe"]

# Every top-level recipe field is in one of these three (tests/recipe/test_spec.py checks it, so a field added later is
# placed on purpose). The sections the figures depend on: a change makes results stale (qbench.gate.fresh
# .stale_sections) and the plan another (qbench.execute.plan.plan_fingerprint); latency included, as the SLO gate and
# the serving figures are judged on what was timed, and task_options, backend_resources (which GPU kind times) and
# analysis (whether the range analysis was recorded).
RESULT_SECTIONS = ("name", "task", "task_options", "model", "data", "variants", "search", "backends",
                   "backend_resources", "metrics", "latency", "analysis")  # fmt: skip
# What the gate and what follows it read beside the figures: changing them leaves results current. The SLO's load
# settings, which its figures were simulated with, are checked against the results' own (qbench.slo); costs are
# computed from the prices when judged. They are still in the plan's fingerprint: a search picks by the gate.
JUDGED_SECTIONS = ("gate", "slo", "cost", "registry")
# Where results go and how jobs run, field by field: no figure depends on them (the machine a job ran on is compared
# per measurement: qbench.execute.resume.measured_with), so a resume takes up a run whatever they were. A field added
# to one of these sections later is in the plan's fingerprint until it is named here.
RUN_FIELDS: dict[str, tuple[str, ...]] = {
    "tracking": ("uri", "experiment"),
    "output_dir": (),  # the whole field
    "executor": ("kind", "address", "store", "retries", "timeout_s"),
}


TorchDtype = Literal["float32", "float16", "bfloat16", "int64", "int32", "uint8", "bool"]


class ModelSpec(_Strict):
    """Either an ONNX file (`path`) or a PyTorch module (`torch` factory + optional `weights`), exported once."""

    path: Path | None = path_field("ONNX model, relative to the recipe file")
    torch: str | None = Field(
        None, description="'package.module:factory' returning an nn.Module (imported as Python code)"
    )
    weights: Path | None = path_field("state_dict file, loaded with torch.load(weights_only=True)")
    factory_arguments: dict[str, JsonValue] = Field(
        {}, description="keyword arguments the `torch` factory is called with"
    )
    example_inputs: dict[str, list[Annotated[int, Field(gt=0)]]] | None = Field(
        None, description="input name -> example shape (first dim is the batch, exported as dynamic)"
    )
    input_dtypes: dict[str, TorchDtype] = Field({}, description="input name -> dtype; default float32")
    output_names: list[str] | None = Field(None, description="names given to the exported outputs")
    opset: int = Field(17, ge=13, description="ONNX opset for the export")
    output: str | None = Field(None, description="model output to evaluate; default: the one the task's rules pick")
    outputs: list[str] | None = Field(
        None, description="several outputs to evaluate, each with its own metrics (named 'output/metric')"
    )

    @model_validator(mode="after")
    def _one_source(self) -> ModelSpec:
        if self.output is not None and self.outputs is not None:
            raise ValueError("outputs: give `output` (one) or `outputs` (several), not both")
        if self.outputs is not None and (not self.outputs or len(set(self.outputs)) != len(self.outputs)):
            raise ValueError("outputs: expected a non-empty list of distinct output names")
        if (self.path is None) == (self.torch is None):
            raise ValueError("give either `path` (an ONNX file) or `torch` (a module factory), not both or neither")
        if self.torch is not None:
            if not re.fullmatch(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*", self.torch):
                raise ValueError(f"torch: got {self.torch!r}, expected 'package.module:factory'")
            if not self.example_inputs:
                raise ValueError("example_inputs: a PyTorch model needs the shape of each input, e.g. "
                                 "{input: [1, 3, 224, 224]}")  # fmt: skip
            unknown = sorted(set(self.input_dtypes) - set(self.example_inputs))
            if unknown:
                raise ValueError(f"input_dtypes: {unknown[0]!r} is not in example_inputs")
        else:
            given = [f for f in ("weights", "factory_arguments", "example_inputs", "input_dtypes", "output_names")
                     if f in self.model_fields_set]
            if given:
                raise ValueError(f"{given[0]}: applies only to a PyTorch model (`torch:`), not to an ONNX file")
        return self

    def input_dtype(self, name: str) -> str:
        """The dtype a PyTorch model's input `name` is exported with: model.input_dtypes', float32 by default."""
        return self.input_dtypes.get(name, "float32")


class StabilitySpec(_Strict):
    """Adaptive timing: run windows of timed runs until the last `windows` windows' p50s agree."""

    threshold: float = Field(
        0.05, gt=0, description="windows agree when (max - min) / median of their p50s is at most this"
    )
    windows: int = Field(3, ge=2, description="how many consecutive windows must agree")
    window_runs: int | None = Field(
        None, gt=0,
        description="runs per window; default: latency.iterations // windows (the minimum holds that many windows)",
    )
    window_seconds: float = Field(0.05, ge=0, description="a window also lasts at least this much summed run time")
    max_iterations: int | None = Field(
        None, gt=0,
        description="timed runs per batch size never exceed this; default: 100,000 or latency.iterations if more",
    )
    max_seconds: float = Field(
        10.0, gt=0, description="stop timing a batch size after this long once latency.iterations runs are done "
        "(the figure is then flagged unstable unless its windows already agreed)"
    )  # fmt: skip


class LatencySpec(_Strict):
    batch_sizes: list[Annotated[int, Field(gt=0)]] = [1, 32]
    warmup: int = Field(20, ge=0, description="untimed runs before timing, per batch size")
    iterations: int = Field(
        200, gt=0, description="timed runs per batch size: the minimum with `stability`, the exact count without"
    )
    threads: int | None = Field(None, gt=0, description="intra-op threads; default: the runtime's choice")
    stability: StabilitySpec | None = Field(
        StabilitySpec(), description="adaptive timing until windows agree; null times exactly `iterations` runs"
    )

    @model_validator(mode="after")
    def _bounds(self) -> LatencySpec:
        cap = self.stability.max_iterations if self.stability is not None else None
        if cap is not None and cap < self.iterations:
            raise ValueError(
                f"stability.max_iterations: got {cap}, expected at least "
                f"iterations ({self.iterations})"
            )
        return self

    @field_validator("batch_sizes")
    @classmethod
    def _nonempty(cls, v: list[int]) -> list[int]:
        if not v:
            raise ValueError("expected at least one batch size")
        return sorted(set(v))


TRACKING_SCHEMES = ("sqlite", "file", "http", "https", "postgresql", "mysql", "mssql", "databricks")


class TrackingSpec(_Strict):
    uri: str | None = Field(
        None,
        description="MLflow tracking URI (a relative sqlite:/// path is relative to the recipe); "
        "default sqlite:///mlflow.db in the working directory",
    )
    experiment: str | None = Field(None, min_length=1, description="MLflow experiment; default: the recipe name")

    @field_validator("uri")
    @classmethod
    def _known_scheme(cls, v: str | None) -> str | None:
        if v is None:
            return v
        scheme = v.split("://", 1)[0].split("+", 1)[0].lower() if "://" in v else ""
        if scheme not in TRACKING_SCHEMES:
            raise ValueError(
                f"got {short_repr(v)}, expected a URI with a scheme {', '.join(TRACKING_SCHEMES)} "
                "(e.g. sqlite:///mlflow.db or http://mlflow.internal:5000)"
            )
        if scheme == "file" and os.environ.get("MLFLOW_ALLOW_FILE_STORE", "").lower() not in ("true", "1"):
            raise ValueError(f"got {short_repr(v)}: MLflow refuses its file store (maintenance mode); expected a "
                             "database store such as sqlite:///mlflow.db, or set "
                             "MLFLOW_ALLOW_FILE_STORE=true")  # fmt: skip
        return v


class AnalysisSpec(_Strict):
    ranges: bool = Field(
        True,
        description="one extra FP32 pass over the evaluation rows recording each float tensor's abs max per slice "
        "(FP16/BF16/FP8 overflows) and the share of activations each INT8/FP8 variant clips at its calibrated range",
    )


class Recipe(_Strict):
    name: Name
    task: str = Field("classification", description="how outputs are judged: a name registered in qbench.tasks")
    task_options: dict[str, Any] = Field({}, description="the task's own options (span: max_answer_tokens)")
    model: ModelSpec
    data: DataSpec
    variants: list[VariantSpec] = []
    backends: list[str] = ["onnxruntime-cpu"]
    latency: LatencySpec = LatencySpec()
    metrics: list[MetricSpec] = Field([], description="custom metrics, reported beside the task's")
    gate: GateSpec = GateSpec()
    tracking: TrackingSpec = TrackingSpec()
    analysis: AnalysisSpec = AnalysisSpec()
    slo: SloSpec | None = Field(None, description="a p99 latency budget, at a fixed batch size or under load")
    cost: CostSpec | None = Field(None, description="price per hour per backend, for cost per inference")
    registry: RegistrySpec | None = Field(None, description="register the gate's winners in the MLflow Model Registry")
    search: SearchSpec | None = Field(
        None, description="find the fastest INT8 variant passing the gate (qbench.search)"
    )
    output_dir: Path = path_field(
        "results go to <output_dir>/<name>/<timestamp>/ (relative to the recipe)", Path("reports")
    )
    executor: ExecutorSpec = ExecutorSpec()
    backend_resources: dict[str, BackendResources] = Field({}, description="backend -> accelerator pin (Ray)")

    _source: Path = PrivateAttr(default=Path("recipe.yaml"))
    _sha256: str = PrivateAttr(default="")

    _backend_entries = model_validator(mode="before")(split_backend_entries)  # {name, accelerator} entries

    _gate_metric = model_validator(mode="before")(default_gate_metric)  # the task's own, or the first custom one

    @field_validator("backends")
    @classmethod
    def _backends_known(cls, v: list[str]) -> list[str]:
        from qbench.backends import BACKENDS

        if not v:
            raise ValueError("expected at least one backend")
        for name in v:
            if name not in BACKENDS:
                raise ValueError(expected_one_of(name, BACKENDS.names()))
        return list(dict.fromkeys(v))

    @field_validator("task")
    @classmethod
    def _task_known(cls, v: str) -> str:
        from qbench.errors import QbenchError
        from qbench.tasks import get_task

        try:
            get_task(v)
        except QbenchError as exc:  # unknown (did you mean ...) or not supported
            raise ValueError(str(exc).removeprefix("task: ")) from None
        return v

    @model_validator(mode="after")
    def _cross_checks(self) -> Recipe:
        from qbench.errors import QbenchError
        from qbench.tasks import TASKS, get_task

        names = [v.name for v in self.variants]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"variants: duplicate variant name {duplicates[0]!r}")
        check_case_apart([*names, *([self.search.name] if self.search is not None else []), "fp32"])
        for v in self.variants:
            if v.name == "fp32" and v.precision != "fp32":
                raise ValueError("variants: the name 'fp32' is reserved for the FP32 reference")
        for index, v in enumerate(self.variants):
            if self.model.torch is None and (v.qat is not None or v.quantizer == "modelopt"):
                what = "qat" if v.qat is not None else "quantizer"
                raise ValueError(
                    f"variants[{index}].{what}: needs a PyTorch model source (model.torch); "
                    "this recipe's model is an ONNX file"
                )
            if v.compile and not any(b.startswith("torch-") for b in self.backends):
                raise ValueError(f"variants[{index}].compile: applies only to torch-cpu / torch-cuda backends")
            if v.qat is not None and v.qat.loss == "label" and not get_task(self.task).has_qat_label_loss:
                raise ValueError(f"variants[{index}].qat.loss: task {self.task!r} has no label loss; use 'distill'")
            if v.qat is not None and v.qat.loss == "label" and self.data.label is None:
                raise ValueError(f"variants[{index}].qat.loss: 'label' needs data.label; use 'distill' without labels")
        if isinstance(self.data.label, list) and not get_task(self.task).reads_label_columns:
            readers = " / ".join(name for name in TASKS if TASKS.get(name).reads_label_columns)
            raise ValueError(f"data.label: a list of columns (one 0/1 column per label) is read by task {readers} "
                             f"only; expected one label column for task {self.task!r}")  # fmt: skip
        fed_labels = [column for column in self.data.label_columns if column in self.data.fed_columns]
        if fed_labels and not get_task(self.task).labels_may_be_fed:
            raise ValueError(f"data.inputs: column {fed_labels[0]!r} is data.label too: the model would be fed the "
                             f"answer it is scored against, so its accuracy and every variant's drop would measure "
                             f"that leak (a variant's errors on the other inputs hide behind it); expected the "
                             f"label column kept out of data.inputs (task {self.task!r})")  # fmt: skip
        for index, backend in enumerate(self.backends):
            if backend.startswith("torch-") and self.model.torch is None:
                raise ValueError(f"backends[{index}]: {backend} needs a PyTorch model source (model.torch)")
        try:
            get_task(self.task).configured(self.task_options)
        except QbenchError as exc:
            raise ValueError(f"task_options.{exc}") from None
        check_metrics(self)
        check_serving(self.slo, self.cost, self.backends, self.latency.batch_sizes, self.latency.iterations)
        check_registry(self.registry, self.backends, self.latency.batch_sizes)
        check_backend_resources(self.backend_resources, self.backends)
        check_search(self.search, names)
        check_search_batches(self.search, self.latency.batch_sizes)
        return self

    def custom_metrics(self) -> list[MetricInfo]:
        """The recipe's own metrics with their directions (what `custom_metrics(...)` scopes a sweep to)."""
        return custom_metric_infos(self.metrics)

    # -- derived views -------------------------------------------------------------------------

    @property
    def source(self) -> Path:
        """The recipe file this was loaded from."""
        return self._source

    @property
    def sha256(self) -> str:
        """Hash of the recipe file's bytes: results record it so the gate can tell stale results."""
        return self._sha256

    @property
    def base_dir(self) -> Path:
        return self._source.parent

    def resolve(self, path: Path) -> Path:
        """A path from the recipe, relative to the recipe file (symbolic links followed; a loop of them, which
        `_check_files` reports, is left as written)."""
        if path.is_absolute():
            return path
        try:
            return (self.base_dir / path).resolve()
        except (OSError, RuntimeError):  # a symlink loop: RuntimeError before Python 3.13, OSError since
            return Path(os.path.abspath(self.base_dir / path))

    @property
    def output_path(self) -> Path:
        """output_dir, relative to the recipe file: results land in one place whatever the working directory."""
        return self.resolve(self.output_dir)

    @property
    def tracking_uri(self) -> str | None:
        """tracking.uri with a relative sqlite database path made absolute against the recipe's folder."""
        uri = self.tracking.uri
        if uri is None or not uri.startswith("sqlite:///") or uri.startswith("sqlite:////"):
            return uri
        database, _, query = uri.removeprefix("sqlite:///").partition("?")
        if database in ("", ":memory:"):
            return uri
        return "sqlite:///" + self.resolve(Path(database)).as_posix() + (f"?{query}" if query else "")

    @property
    def model_path(self) -> Path | None:
        """The ONNX file of an ONNX-source recipe; None for a PyTorch source (see qbench.sources)."""
        return self.resolve(self.model.path) if self.model.path is not None else None

    @property
    def weights_path(self) -> Path | None:
        return self.resolve(self.model.weights) if self.model.weights is not None else None

    @property
    def data_path(self) -> Path:
        return self.resolve(self.data.path)

    @property
    def calibration_data_path(self) -> Path | None:
        """A separate calibration file, when the recipe names one (else rows come from data.path)."""
        return self.resolve(self.data.calibration.path) if self.data.calibration.path is not None else None

    def fingerprint(self, inputs: Mapping[str, InputDigest] | None = None) -> str:
        """Hash of what decides the accuracy results: task, model and data (file contents),
        variants, backends and custom metrics. Gate and tracking settings are left out, so tightening the
        gate does not make earlier results stale, while a new model or data set does. `inputs`: the input
        digests a sweep recorded when it started (its files are not hashed again), else the files hashed now."""
        from qbench.provenance import (
            input_digests,  # per-input digests: the gate says which input changed
        )

        payload = self.model_dump(mode="json", include=set(RESULT_SECTIONS))
        digest = hashlib.sha256(json.dumps(payload, sort_keys=True).encode())
        for name, entry in sorted((inputs if inputs is not None else input_digests(self)).items()):
            digest.update(f"{name}={entry.sha256}".encode())
        return digest.hexdigest()

    @property
    def fits_on_calibration_rows(self) -> bool:
        """Whether a variant is fitted on the calibration rows: calibrated ranges, SmoothQuant's scales, QAT's
        starting point, the INT8 search's static candidates (dynamic INT8 and float casts see no calibration row)."""
        return self.search is not None or any(
            v.precision in ("int8", "fp8")
            and (v.calibrator != "dynamic" or v.smoothquant is not None or v.qat is not None)
            for v in self.variants
        )

    def all_variants(self) -> list[VariantSpec]:
        """The FP32 reference first (always built), then the recipe's other variants in order."""
        reference = next((v for v in self.variants if v.precision == "fp32"), None)
        reference = reference or reference_variant()
        return [reference] + [v for v in self.variants if v is not reference]

    def planned_variants(self) -> list[VariantSpec]:
        """`all_variants()`, then the INT8 search's variant when the recipe has `search:` (the search decides
        what that variant is; its spec only names it in the plan)."""
        if self.search is None:
            return self.all_variants()
        return [*self.all_variants(), VariantSpec(name=self.search.name, precision="int8", calibrator="dynamic")]


# -- loading ------------------------------------------------------------------------------------


def load_recipe(path: str | Path) -> Recipe:
    """Parse, validate and resolve a recipe file. Raises RecipeError naming file, field and expectation."""
    path = Path(path)
    raw, raw_bytes = read_recipe_yaml(path)
    if not isinstance(raw, dict):
        raise RecipeError(
            path, "", f"expected a mapping (name: ..., model: ..., data: ...) at the top level, got {_yaml_kind(raw)}"
        )
    try:
        recipe = Recipe.model_validate(raw)
    except ValidationError as exc:
        raise recipe_error(path, exc, Recipe) from None
    recipe._source = path.resolve()
    recipe._sha256 = hashlib.sha256(raw_bytes).hexdigest()
    _check_files(recipe)
    return recipe


def _yaml_kind(value: Any) -> str:
    kinds = {list: "a list", str: "a string", int: "a number", float: "a number", bool: "a boolean"}
    return kinds.get(type(value), f"a {type(value).__name__}")


def _check_files(recipe: Recipe) -> None:
    """Every file the recipe names exists and is a file (or, for data, a file or a folder)."""
    files = {"model.path": recipe.model_path, "model.weights": recipe.weights_path}
    for field, path in files.items():
        if path is not None and not path.is_file():
            problem = "is a folder, expected a file" if path.is_dir() else _unreadable(path, "file not found")
            raise RecipeError(recipe.source, field, f"{problem}: {path}")
        if path is not None and path.stat().st_size == 0:
            raise RecipeError(recipe.source, field, f"{path} is empty (0 bytes); expected the model file")
    folders = {"data.path": recipe.data_path, "data.calibration.path": recipe.calibration_data_path}
    for field, path in folders.items():
        if path is not None and not path.exists():
            raise RecipeError(recipe.source, field, f"{_unreadable(path, 'file or folder not found')}: {path}")


def _unreadable(path: Path, missing: str) -> str:
    """Why `path` cannot be opened: `missing` when nothing is there, else the system's reason (a loop of symbolic
    links, a folder that may not be searched)."""
    try:
        path.stat()
    except FileNotFoundError:
        return missing
    except OSError as exc:
        return f"cannot open ({exc.strerror or exc})"
    return "not a regular file"
