"""Adversarial results: the gate judges what the recipe asked for, never what results.json claims.

One real sweep of a small tabular model (a module fixture, a few seconds). Each case then breaks a
COPY of its results.json, or (restored afterwards) one of its inputs, as an adversary or a broken run
would, runs `qbench gate` and checks the exit code (never 0 for a tampered or broken file, 1 only for
a genuine breach on consistent results) and that the message names the field, the slice or the file.
"""

from __future__ import annotations

import contextlib
import copy
import json
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import yaml
from sweep_factory import resign
from user_model import make_user_project

from qbench.cli.app import main
from qbench.results.schema import content_digest
from qbench.tasks.base import wilson

pytestmark = pytest.mark.slow

INT8 = "int8-minmax"
BACKEND = "onnxruntime-cpu"


@dataclass(frozen=True)
class Swept:
    root: Path
    recipe: Path
    results: Path

    def raw(self) -> dict[str, Any]:
        return json.loads(self.results.read_text())


@pytest.fixture(scope="module")
def swept(tmp_path_factory: pytest.TempPathFactory) -> Swept:
    """The user project swept once: FP32, FP16, INT8 on ONNX Runtime CPU; slices by band plus a named one."""
    root = tmp_path_factory.mktemp("gate_results")
    recipe = make_user_project(root)
    raw = yaml.safe_load(recipe.read_text())
    raw["variants"] = [
        {"name": "fp16", "precision": "fp16"},
        {"name": INT8, "precision": "int8", "calibrator": "minmax"},
    ]
    raw["latency"] = {"batch_sizes": [1, 4], "warmup": 1, "iterations": 3, "threads": 1, "stability": None}
    raw["data"]["slices"].append({"name": "large-radius", "filter": {"mean_radius": {"gt": 15.0}}})
    raw["gate"] = {"metric": "agreement", "max_drop": 0.2, "max_slice_drop": 0.3, "applies_to": ["*"]}
    raw["output_dir"] = "reports"  # relative: a copy of the project finds its own results
    del raw["tracking"]
    recipe.write_text(yaml.safe_dump(raw, sort_keys=False))
    assert main(["sweep", str(recipe), "--no-track"]) == 0
    [results] = sorted((root / "reports").glob("*/*/results.json"))
    return Swept(root, recipe, results)


# -- editing helpers ---------------------------------------------------------------------------------


def variant(raw: dict[str, Any], name: str) -> dict[str, Any]:
    return next(v for v in raw["variants"] if v["variant"] == name)


def scope(raw: dict[str, Any], name: str, slice_name: str) -> dict[str, Any]:
    accuracy = variant(raw, name)["accuracy"]
    return accuracy["overall"] if slice_name == "overall" else next(s for s in accuracy["slices"]
                                                                    if s["name"] == slice_name)


Edit = Callable[[dict[str, Any]], Any]
Case = Callable[[Swept, Path], contextlib.AbstractContextManager[list[str]]]


def edited(edit: Edit, *, signed: bool = True, flags: tuple[str, ...] = ()) -> Case:
    """A case that judges a copy of results.json changed by `edit` (re-signed unless `signed` is False)."""

    @contextlib.contextmanager
    def case(swept: Swept, tmp: Path) -> Iterator[list[str]]:
        raw = copy.deepcopy(swept.raw())
        edit(raw)
        path = tmp / "results.json"
        path.write_text(json.dumps(resign(raw) if signed else raw, indent=2))
        yield ["gate", "--results", str(path), *flags]

    return case


def written(text: str | bytes | Callable[[str], str]) -> Case:
    """A case that judges a file holding `text` (or `text(original)`)."""

    @contextlib.contextmanager
    def case(swept: Swept, tmp: Path) -> Iterator[list[str]]:
        path = tmp / "results.json"
        content = text(swept.results.read_text()) if callable(text) else text
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
        yield ["gate", "--results", str(path)]

    return case


def input_changed(relative: str, change: Callable[[Path], None], *, with_recipe: bool,
                  flags: tuple[str, ...] = ()) -> Case:
    """A case that changes one input of the sweep (then restores it) and gates by --results or by the recipe."""

    @contextlib.contextmanager
    def case(swept: Swept, tmp: Path) -> Iterator[list[str]]:
        if with_recipe:  # a copy of the whole project: its recipe finds its own results and inputs
            root = tmp / "project"
            shutil.copytree(swept.root, root)
            change(root / relative)
            yield ["gate", str(root / swept.recipe.name), *flags]
            return
        target = swept.root / relative
        saved = tmp / "saved"
        shutil.copy2(target, saved)
        try:
            change(target)
            yield ["gate", "--results", str(swept.results), *flags]
        finally:
            shutil.copy2(saved, target)

    return case


def recipe_changed(change: Callable[[dict[str, Any]], None]) -> Case:
    """A case that judges the sweep's results against an edited copy of its recipe."""

    @contextlib.contextmanager
    def case(swept: Swept, tmp: Path) -> Iterator[list[str]]:
        root = tmp / "project"
        shutil.copytree(swept.root, root)
        recipe = root / swept.recipe.name
        raw = yaml.safe_load(recipe.read_text())
        change(raw)
        recipe.write_text(yaml.safe_dump(raw, sort_keys=False))
        yield ["gate", str(recipe), "--results", str(root / swept.results.relative_to(swept.root))]

    return case


def flip_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def relabel_first_row(path: Path) -> None:
    table = pd.read_parquet(path)
    table.loc[0, "y"] = 1 - table.loc[0, "y"]
    table.to_parquet(path, index=False)


# -- edits -------------------------------------------------------------------------------------------


def set_in(path: tuple[Any, ...], value: Any) -> Edit:
    def edit(raw: dict[str, Any]) -> None:
        target: Any = raw
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value

    return edit


def on_variant(name: str, **fields: Any) -> Edit:
    return lambda raw: variant(raw, name).update(fields)


def params_of(name: str, **params: Any) -> Edit:
    return lambda raw: variant(raw, name)["params"].update(params)


def on_scope(name: str, slice_name: str, **fields: Any) -> Edit:
    return lambda raw: scope(raw, name, slice_name).update(fields)


def on_all_scopes(slice_name: str, **fields: Any) -> Edit:
    def edit(raw: dict[str, Any]) -> None:
        for v in raw["variants"]:
            scope(raw, v["variant"], slice_name).update(fields)

    return edit


def metric(name: str, slice_name: str, value: float | None, key: str = "agreement") -> Edit:
    return lambda raw: scope(raw, name, slice_name)["metrics"].__setitem__(key, value)


def lowered(name: str, slice_name: str, value: float) -> Edit:
    """Agreement lowered to `value`, with the drop from FP32's figure and the interval a sweep records beside it."""

    def edit(raw: dict[str, Any]) -> None:
        reference = scope(raw, "fp32", slice_name)["metrics"]["agreement"]
        edited = scope(raw, name, slice_name)
        edited["metrics"]["agreement"] = value
        edited["drops"]["agreement"] = reference - value
        edited["intervals"]["agreement"] = list(wilson(value, edited["size"]))

    return edit


def drop_slice(*names: str) -> Edit:
    def edit(raw: dict[str, Any]) -> None:
        for v in raw["variants"]:
            if v["variant"] in names:
                v["accuracy"]["slices"] = [s for s in v["accuracy"]["slices"] if s["name"] != "band=small"]

    return edit


def drop_named_slice(raw: dict[str, Any]) -> None:
    for v in raw["variants"]:
        v["accuracy"]["slices"] = [s for s in v["accuracy"]["slices"] if s["name"] != "large-radius"]


def add_slice(raw: dict[str, Any]) -> None:
    for v in raw["variants"]:
        extra = copy.deepcopy(v["accuracy"]["slices"][0])
        extra["name"] = "band=huge"
        v["accuracy"]["slices"].append(extra)


def duplicate_slice(raw: dict[str, Any]) -> None:
    slices = variant(raw, INT8)["accuracy"]["slices"]
    slices.append(copy.deepcopy(slices[0]))


def remove_variant(name: str) -> Edit:
    return lambda raw: raw.__setitem__("variants", [v for v in raw["variants"] if v["variant"] != name])


def add_variant(name: str, backend: str = BACKEND) -> Edit:
    def edit(raw: dict[str, Any]) -> None:
        extra = copy.deepcopy(variant(raw, INT8))
        extra.update(variant=name, backend=backend)
        raw["variants"].append(extra)

    return edit


def move_to_backend(raw: dict[str, Any]) -> None:
    variant(raw, INT8)["backend"] = "onnxruntime-cuda"


def nonfinite_rows(name: str, slice_name: str, count: int, *, nan_metric: bool = False) -> Edit:
    """Consistent non-finite outputs: `count` rows of `slice_name` (and so of overall)."""

    def edit(raw: dict[str, Any]) -> None:
        accuracy = variant(raw, name)["accuracy"]
        accuracy["nonfinite_outputs"] += count
        accuracy["overall"]["nonfinite_outputs"] += count
        scope(raw, name, slice_name)["nonfinite_outputs"] += count
        if nan_metric:  # as a sweep writes it: NaN (null) figure, NaN drop
            scope(raw, name, slice_name)["metrics"]["agreement"] = None
            scope(raw, name, slice_name)["drops"]["agreement"] = None

    return edit


def both(*edits: Edit) -> Edit:
    def edit(raw: dict[str, Any]) -> None:
        for one in edits:
            one(raw)

    return edit


def drop_key(*path: str) -> Edit:
    def edit(raw: dict[str, Any]) -> None:
        target: Any = raw
        for key in path[:-1]:
            target = target[key]
        del target[path[-1]]

    return edit


def drop_point(batch_size: int, *names: str) -> Edit:
    """The latency point at `batch_size` left out of each named variant (a batch size that went missing)."""

    def edit(raw: dict[str, Any]) -> None:
        for name in names:
            latency = variant(raw, name)["latency"]
            latency["points"] = [p for p in latency["points"] if p["batch_size"] != batch_size]

    return edit


def add_point(batch_size: Any, *, copy_of: int = 1) -> Edit:
    """A second point of INT8's at `copy_of`, relabelled `batch_size` (the same size: a duplicate)."""

    def edit(raw: dict[str, Any]) -> None:
        points = variant(raw, INT8)["latency"]["points"]
        extra = copy.deepcopy(next(p for p in points if p["batch_size"] == copy_of))
        points.append({**extra, "batch_size": batch_size})

    return edit


EVERY_VARIANT = ("fp32", "fp16", INT8)
UNCHECKED = ("--no-staleness-check",)  # the model is not read: the recipe and the results' record decide


def forget_int8_in_recipe(raw: dict[str, Any]) -> None:
    resolved = raw["recipe"]["resolved"]
    resolved["variants"] = [v for v in resolved["variants"] if v["name"] != INT8]


def add_variant_to_recipe(raw: dict[str, Any]) -> None:
    raw["variants"].append({"name": "int8-pct", "precision": "int8", "calibrator": "percentile"})


# -- the cases ---------------------------------------------------------------------------------------

CASES = [
    # controls: untouched results pass; so do consistent results the user asked to judge as they are
    pytest.param(edited(lambda raw: None), 0, "gate: PASS", id="control-untouched-resigned"),
    pytest.param(
        edited(both(nonfinite_rows(INT8, "band=small", 2), nonfinite_rows("fp32", "band=small", 2))),
        0, "gate: PASS", id="control-nonfinite-same-as-fp32",
    ),  # fmt: skip
    # the file itself: digest, shape, completeness
    pytest.param(edited(on_variant(INT8, status="skipped"), signed=False), 2, "digest: does not match",
                 id="flip-status-unsigned"),
    pytest.param(edited(metric(INT8, "overall", 0.5), signed=False), 2, "digest: does not match",
                 id="edit-metric-keep-digest"),
    pytest.param(edited(remove_variant(INT8), signed=False), 2, "digest: does not match",
                 id="delete-variant-keep-digest"),
    pytest.param(edited(lambda raw: None, signed=False), 0, "gate: PASS", id="control-untouched-unsigned"),
    pytest.param(edited(both(resign, drop_key("digest")), signed=False), 2, "digest: missing", id="no-digest"),
    pytest.param(edited(both(resign, set_in(("digest",), "0" * 64)), signed=False), 2, "digest: does not match",
                 id="wrong-digest"),
    pytest.param(written(lambda text: text[: len(text) // 2]), 2, "not a valid qbench results file", id="truncated"),
    pytest.param(written(""), 2, "not a valid qbench results file", id="empty-file"),
    pytest.param(written(b"\xff\xfe\x00garbage"), 2, "not a valid qbench results file", id="not-utf8"),
    pytest.param(written("[]"), 2, "expected a JSON object of results, got a list", id="a-list"),
    pytest.param(written("42"), 2, "expected a JSON object of results, got a int", id="a-number"),
    pytest.param(written(lambda text: text.replace('"agreement": 1.0', '"agreement": NaN', 1)), 2, "holds NaN",
                 id="bare-nan-token"),
    pytest.param(edited(set_in(("complete",), False)), 2, "complete: got False", id="incomplete-run"),
    pytest.param(edited(drop_key("complete")), 2, "complete: got None", id="no-completion-marker"),
    pytest.param(edited(set_in(("schema_version",), 2)), 2, "schema_version 2 is not supported", id="future-schema"),
    pytest.param(edited(drop_key("variants")), 2, "not a valid qbench results file (KeyError: 'variants')",
                 id="no-variants-key"),
    pytest.param(edited(on_scope(INT8, "overall", size="many")), 2,
                 "accuracy.overall.size: got 'many', expected a whole number >= 0", id="size-not-a-number"),
    # statuses qbench's own rules would not have produced
    pytest.param(edited(on_variant(INT8, status="skipped", error="cannot run", accuracy=None)), 2,
                 f"{INT8}@{BACKEND}: status 'skipped', but {BACKEND} runs every int8",
                 id="skipped-on-ort"),  # fmt: skip
    pytest.param(edited(on_variant("fp32", status="skipped", error="cannot run", accuracy=None)), 2,
                 f"fp32@{BACKEND}: status 'skipped'", id="reference-skipped"),  # fmt: skip
    pytest.param(edited(on_variant(INT8, status="passed")), 2, "status got 'passed', expected one of",
                 id="unknown-status"),
    pytest.param(edited(on_variant(INT8, status="failed")), 2, "status 'failed' without the reason",
                 id="failed-no-error"),
    pytest.param(edited(on_variant(INT8, accuracy=None)), 2, f"{INT8}@{BACKEND}: status 'ok' without accuracy",
                 id="ok-no-accuracy"),
    pytest.param(edited(on_variant(INT8, latency=None)), 2, "status 'ok' without latency", id="ok-no-latency"),
    pytest.param(edited(on_variant(INT8, error="boom")), 2, "status 'ok' with an error recorded", id="ok-with-error"),
    pytest.param(edited(on_variant(INT8, model_bytes=-5)), 2, "model_bytes: got -5", id="negative-model-size"),
    pytest.param(edited(on_variant(INT8, precision="fp16")), 2, "precision: got 'fp16', the recipe builds 'int8'",
                 id="wrong-precision"),
    # latency: one point per batch size the recipe times, none twice, none it does not time
    pytest.param(edited(drop_point(4, INT8)), 2, f"{INT8}@{BACKEND}: latency: no point at batch size 4; the sweep "
                 "times batch sizes 1, 4", id="latency-point-missing"),  # fmt: skip
    pytest.param(edited(drop_point(4, *EVERY_VARIANT)), 2, f"fp32@{BACKEND}: latency: no point at batch size 4",
                 id="latency-point-missing-everywhere"),  # fmt: skip
    pytest.param(edited(drop_point(4, INT8), flags=UNCHECKED), 2,
                 f"{INT8}@{BACKEND}: latency: no point at batch size 4",
                 id="latency-point-missing-inputs-unchecked"),  # fmt: skip
    pytest.param(edited(both(drop_point(4, *EVERY_VARIANT), set_in(("recipe", "latency", "batch_sizes"), [1]))), 2,
                 "recipe.latency.batch_sizes: the results record [1], but a sweep of the recipe times batch sizes 1, 4",
                 id="latency-batch-size-cut-from-points-and-record"),  # fmt: skip
    pytest.param(edited(both(drop_point(4, *EVERY_VARIANT), set_in(("recipe", "latency", "batch_sizes"), [1])),
                        flags=UNCHECKED), 2, f"fp16@{BACKEND}: latency: no point at batch size 4",
                 id="latency-batch-size-cut-inputs-unchecked"),  # fmt: skip
    pytest.param(edited(lambda raw: variant(raw, INT8)["latency"]["points"][0].update(p50_ms=None)), 2,
                 f"{INT8}@{BACKEND}: latency at batch 1: expected finite, non-negative times",
                 id="latency-time-null"),  # fmt: skip
    pytest.param(edited(lambda raw: variant(raw, INT8)["latency"]["points"][0].update(spread="0.01")), 2,
                 "latency.points[0].spread: got '0.01', expected a number or null",
                 id="latency-spread-as-text"),  # fmt: skip
    pytest.param(edited(add_point(1)), 2, f"{INT8}@{BACKEND}: latency: 2 points at batch size 1, expected one per "
                 "batch size", id="latency-point-twice"),  # fmt: skip
    pytest.param(edited(add_point(16)), 2, f"{INT8}@{BACKEND}: latency: a point at batch size 16, which the sweep "
                 "does not time (it times batch sizes 1, 4)", id="latency-point-not-asked-for"),  # fmt: skip
    pytest.param(edited(both(drop_point(4, INT8), add_point("4"))), 2,
                 "latency.points[1].batch_size: got '4', expected "
                 "a whole number >= 0", id="latency-batch-size-as-text"),  # fmt: skip
    # variants and backends: what the recipe asked for
    pytest.param(edited(remove_variant(INT8)), 2, f"{INT8}@{BACKEND}: no results for this variant",
                 id="delete-variant"),
    pytest.param(edited(remove_variant("fp32")), 2, f"no usable FP32 reference on {BACKEND}", id="delete-reference"),
    pytest.param(edited(add_variant("int8-extra")), 2, f"int8-extra@{BACKEND}: in the results but not asked for",
                 id="extra-variant"),
    pytest.param(edited(add_variant(INT8)), 2, f"{INT8}@{BACKEND}: recorded more than once", id="duplicate-variant"),
    pytest.param(edited(move_to_backend), 2, f"{INT8}@onnxruntime-cuda: in the results but not asked for",
                 id="other-backend"),
    pytest.param(edited(set_in(("reference",), "fp16")), 2,
                 "reference: got 'fp16', the recipe's FP32 reference is 'fp32'", id="wrong-reference"),
    # slices: the recipe and its data say which, and how many rows
    pytest.param(edited(drop_slice(INT8)), 2, f"{INT8}@{BACKEND}: slice 'band=small' missing",
                 id="delete-slice-one-variant"),
    pytest.param(edited(drop_slice("fp32", "fp16", INT8)), 2, "slice 'band=small' missing (the recipe defines it)",
                 id="delete-slice-everywhere"),
    pytest.param(edited(drop_named_slice), 2, "slice 'large-radius' missing (the recipe defines it)",
                 id="delete-named-slice-everywhere"),
    pytest.param(edited(add_slice), 2, "slice 'band=huge' is not one the recipe defines", id="extra-slice"),
    pytest.param(edited(duplicate_slice), 2, "a slice is recorded more than once", id="duplicate-slice"),
    pytest.param(edited(on_scope(INT8, "band=small", size=40)), 2, "slice 'band=small': size 40, the data gives it",
                 id="slice-size-one-variant"),
    pytest.param(edited(on_all_scopes("band=small", size=40)), 2,
                 "slice 'band=small': size 40, the data gives it 75 rows", id="slice-size-everywhere"),
    pytest.param(edited(on_scope(INT8, "band=small", size=-5)), 2, "size: got -5, expected a whole number >= 0",
                 id="negative-slice-size"),
    pytest.param(edited(on_scope(INT8, "band=small", size=500)), 2, "slice 'band=small': size 500, expected 1..229",
                 id="slice-larger-than-rows"),
    pytest.param(edited(on_scope(INT8, "overall", size=230)), 2, "accuracy.rows 229 / overall size 230",
                 id="overall-size"),
    pytest.param(edited(set_in(("evaluation_rows",), 200)), 2, "differ from evaluation_rows 200", id="evaluation-rows"),
    # metrics and counts
    pytest.param(edited(metric(INT8, "overall", None)), 2,
                 "overall: metric 'agreement' is NaN/inf with no non-finite outputs", id="nan-metric"),
    pytest.param(edited(metric(INT8, "band=large", None)), 2, "slice 'band=large': metric 'agreement' is NaN/inf",
                 id="nan-slice-metric"),
    pytest.param(edited(metric("fp32", "overall", None)), 2, f"fp32@{BACKEND}: overall: metric 'agreement' is NaN/inf",
                 id="nan-reference-metric"),
    pytest.param(edited(lambda raw: scope(raw, INT8, "band=medium")["metrics"].pop("agreement")), 2,
                 "slice 'band=medium': metric 'agreement' missing", id="metric-deleted"),  # fmt: skip
    pytest.param(edited(on_variant(INT8, accuracy={**{}, "rows": 229})), 2, "not a valid qbench results file",
                 id="accuracy-cut-short"),
    pytest.param(edited(lambda raw: scope(raw, INT8, "overall")["intervals"]["agreement"].pop()), 2,
                 "intervals.agreement: got 1 values, expected 2", id="interval-cut-short"),  # fmt: skip
    pytest.param(edited(lambda raw: variant(raw, INT8)["accuracy"].update(nonfinite_outputs=-1)), 2,
                 "nonfinite_outputs: got -1", id="negative-nonfinite"),  # fmt: skip
    pytest.param(edited(on_scope(INT8, "band=small", nonfinite_outputs=90)), 2,
                 "slice 'band=small': nonfinite_outputs 90, expected 0..75",
                 id="slice-nonfinite-over-size"),  # fmt: skip
    # genuine breaches on consistent results: exit 1, naming the slice
    pytest.param(edited(nonfinite_rows(INT8, "band=small", 3)), 1, "band=small", id="nonfinite-breach"),
    pytest.param(edited(nonfinite_rows(INT8, "band=small", 3, nan_metric=True)), 1, "band=small",
                 id="nonfinite-nan-metric-breach"),
    pytest.param(edited(metric(INT8, "overall", "0.99")), 2, "metrics.agreement: got '0.99', expected a number or null",
                 id="metric-as-text"),
    pytest.param(edited(metric(INT8, "band=large", True)), 2, "metrics.agreement: got True, expected a number or null",
                 id="metric-as-boolean"),
    # params the gate reads: a value of another type would be misread (a count "0" is no 0), so it is refused
    pytest.param(edited(params_of(INT8, quantized_nodes="0")), 2,
                 "params.quantized_nodes: got '0', expected a whole number >= 0", id="params-count-as-text"),
    pytest.param(edited(params_of(INT8, integer_kernels_of=[BACKEND])), 2,
                 "params.integer_kernels_of: got ['onnxruntime-cpu'], expected a string", id="params-name-as-list"),
    pytest.param(edited(on_variant(INT8, params=[])), 2, "params: got [], expected a JSON object",
                 id="params-not-an-object"),
    pytest.param(edited(params_of("fp32", one_class_outputs="probabilities")), 2,
                 "params.one_class_outputs: got 'probabilities', expected a list of strings",
                 id="params-names-as-text"),  # fmt: skip
    pytest.param(edited(params_of("fp32", shared_cosines={"probabilities": "0.99"})), 2,
                 "params.shared_cosines.probabilities: got '0.99', expected a number or null",
                 id="params-number-as-text"),  # fmt: skip
    pytest.param(edited(params_of(INT8, quantized_nodes=0)), 0, f"{INT8}@{BACKEND} computes in fp32",
                 id="params-count-zero"),
    # values no scope could hold: the metric's range, a share that is no whole number of the scope's rows
    pytest.param(edited(metric(INT8, "overall", 1.5)), 2, "overall: metric 'agreement' is 1.5, outside its range 0..1",
                 id="rate-above-1"),
    pytest.param(edited(metric(INT8, "band=large", 0.987654321)), 2,
                 "metric 'agreement' is 0.987654321, not a whole number of the scope's", id="rate-of-no-row-count"),
    pytest.param(edited(metric(INT8, "overall", -0.25, key="max_abs_error")), 2,
                 "metric 'max_abs_error' is -0.25, outside its range 0..inf", id="negative-error"),
    pytest.param(edited(lowered(INT8, "band=large", 0.5)), 1, "gate: FAIL — 1 of 2 variants breaches: "
                                                              "int8-minmax@onnxruntime-cpu (band=large);",
                                                              id="accuracy-breach"),
    pytest.param(edited(metric(INT8, "band=large", 0.5)), 2, "slice 'band=large': drop of 'agreement' recorded as 0.0, "
                                                             "but FP32's figure 1.0 and this one 0.5 make it 0.5",
                                                             id="figure-edited-not-its-drop"),
    pytest.param(edited(lowered("fp32", "band=large", 0.5)), 2, "slice 'band=large': drop of 'agreement' recorded as "
                                                                "0.0, but FP32's figure 0.5 and this one 1.0 make it -0.5", id="reference-lowered-to-hide-a-drop"),
    # the embedded recipe
    pytest.param(edited(forget_int8_in_recipe, signed=False), 2, "digest: does not match", id="recipe-edited-unsigned"),
    pytest.param(edited(both(forget_int8_in_recipe, lambda raw: raw.__setitem__("digest", content_digest(raw))), signed=False), 2,
                 "recipe.resolved: does not match recipe.resolved_sha256",
                 id="recipe-edited-file-resigned"),  # fmt: skip
    pytest.param(edited(forget_int8_in_recipe), 2, f"{INT8}@{BACKEND}: in the results but not asked for",
                 id="recipe-edited-resigned"),
    pytest.param(edited(lambda raw: raw["recipe"]["resolved"].__setitem__("backends", ["nope"])), 2,
                 "recipe.resolved.backends", id="recipe-invalid"),  # fmt: skip
    pytest.param(edited(lambda raw: raw["recipe"].pop("resolved")), 2, "recipe.resolved: missing", id="recipe-missing"),
    pytest.param(recipe_changed(lambda raw: raw.__setitem__("name", "other")), 2,
                 "the results are from recipe 'tumour-mlp', not 'other'", id="different-recipe"),  # fmt: skip
    pytest.param(recipe_changed(add_variant_to_recipe), 2, "recipe section 'variants' changed since the sweep",
                 id="recipe-variants-changed"),
    pytest.param(recipe_changed(lambda raw: raw["data"].__setitem__("label", None)), 2,
                 "recipe section 'data' changed since the sweep", id="recipe-data-section-changed"),  # fmt: skip
    pytest.param(recipe_changed(lambda raw: raw.setdefault("latency", {}).__setitem__("threads", 2)), 2,
                 "recipe section 'latency' changed since the sweep", id="recipe-latency-changed"),  # fmt: skip
    # staleness: every input, by content
    pytest.param(input_changed("model/tumour_mlp.onnx", flip_byte, with_recipe=False), 2,
                 "stale results: model (", id="model-changed"),  # fmt: skip
    pytest.param(input_changed("data/patients.parquet", relabel_first_row, with_recipe=False), 2,
                 "stale results: data (", id="data-changed"),  # fmt: skip
    pytest.param(input_changed("data/patients.parquet", Path.unlink, with_recipe=False), 2,
                 "cannot check the results for staleness: data (", id="data-deleted"),  # fmt: skip
    pytest.param(input_changed("data/patients.parquet", Path.unlink, with_recipe=False,
                               flags=("--no-staleness-check",)),
                 0, "inputs not checked for staleness (--no-staleness-check)",
                 id="data-deleted-explicit-flag"),  # fmt: skip
    pytest.param(input_changed("model/tumour_mlp.onnx", flip_byte, with_recipe=True), 2,
                 "stale results: model (", id="model-changed-recipe"),  # fmt: skip
    pytest.param(input_changed("data/patients.parquet", relabel_first_row, with_recipe=True), 2,
                 "stale results: data (", id="data-changed-recipe"),  # fmt: skip
    pytest.param(input_changed("model/tumour_mlp.onnx", Path.unlink, with_recipe=False), 2,
                 "cannot check the results for staleness: model (", id="model-deleted"),  # fmt: skip
    pytest.param(edited(set_in(("inputs",), {})), 2, "inputs: the results record no input digests", id="inputs-erased"),
    # the recipe says which inputs are checked: a dropped entry would leave its file unchecked
    pytest.param(edited(lambda raw: raw["inputs"].pop("data")), 2,
                 "stale results: the recipe reads data, but the results record no digest of it",
                 id="input-record-dropped"),  # fmt: skip
    pytest.param(edited(lambda raw: raw["inputs"]["model"].__setitem__("sha256", "0" * 64)), 2,
                 "stale results: model (", id="input-digest-forged"),  # fmt: skip
]


@pytest.mark.parametrize(("case", "code", "message"), CASES)
def test_gate_judges_what_the_recipe_asked_for(swept: Swept, tmp_path: Path, capsys, case: Case, code: int,
                                               message: str):
    with case(swept, tmp_path) as argv:
        got = main(argv)
    captured = capsys.readouterr()
    shown = " ".join((captured.out + captured.err).split())
    assert got == code, shown[-2000:]
    assert message in shown, shown[-2000:]
    assert "Traceback" not in shown


def test_unusable_files_are_one_line_naming_the_file(swept: Swept, tmp_path: Path, capsys):
    with edited(metric(INT8, "overall", 0.5), signed=False)(swept, tmp_path) as argv:
        assert main(argv) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line == (f"error: {tmp_path / 'results.json'}: digest: does not match the file's content (edited or "
                    "corrupted after the sweep)")


def test_another_recipes_results_are_said_to_be_so_and_nothing_else(swept: Swept, tmp_path: Path, capsys):
    """Judged against another recipe (renamed here, its model moved), the results' own inputs were not called stale."""

    def another_recipe(raw: dict[str, Any]) -> None:
        raw["name"] = "other"
        raw["model"]["path"] = "elsewhere.onnx"

    with recipe_changed(another_recipe)(swept, tmp_path) as argv:
        recipe = Path(argv[1])
        model = recipe.parent / yaml.safe_load(swept.recipe.read_text())["model"]["path"]
        shutil.copy(model, recipe.parent / "elsewhere.onnx")
        flip_byte(recipe.parent / "elsewhere.onnx")  # the other recipe's own model: not the one these results measured
        assert main(argv) == 2
    captured = capsys.readouterr()
    shown = " ".join((captured.out + captured.err).split())
    assert "the results are from recipe 'tumour-mlp', not 'other'" in shown and "stale" not in shown


def test_a_run_of_another_recipe_file_of_the_same_name_is_said_to_be_so(swept: Swept, tmp_path: Path, capsys):
    """A copy of the recipe under another file name, same `name` and output_dir, reading another data file: its
    gate took the newest run in the shared folder (the original's) and said the unedited copy's 'data' section
    'changed since the sweep' and the original's data file 'changed since the sweep' too (neither had changed)."""
    root = tmp_path / "project"
    shutil.copytree(swept.root, root)
    raw = yaml.safe_load(swept.recipe.read_text())
    data = root / raw["data"]["path"]
    shutil.copy(data, data.with_name("copy.parquet"))
    raw["data"]["path"] = str(Path(raw["data"]["path"]).with_name("copy.parquet"))
    copy_recipe = root / "copy.yaml"
    copy_recipe.write_text(yaml.safe_dump(raw, sort_keys=False))
    assert main(["gate", str(copy_recipe)]) == 2
    captured = capsys.readouterr()
    shown = " ".join((captured.out + captured.err).split())
    assert (f"the newest run of recipe 'tumour-mlp' was swept from {swept.recipe}, not {copy_recipe}, and "
            "its section(s) 'data' differ: recipe files sharing a name and output_dir write their runs to one folder; "
            f"give each its own name, or re-run `qbench sweep {copy_recipe}`") in shown, shown[-2000:]  # fmt: skip
    assert "changed since the sweep" not in shown


def test_report_says_why_it_did_not_check_staleness(swept: Swept, capsys):
    """`qbench report` never checks the inputs; its note named `--no-staleness-check`, a flag the user did not
    pass and that `qbench report` does not take, in its output and in the report.html it wrote."""
    assert main(["report", str(swept.results.parent), "--html"]) == 0
    shown = " ".join(capsys.readouterr().out.split())
    expected = "inputs not checked for staleness (`qbench report` shows a past sweep as recorded; `qbench gate` checks"
    assert expected in shown and "--no-staleness-check" not in shown, shown[-2000:]
    assert "--no-staleness-check" not in (swept.results.parent / "report.html").read_text()
