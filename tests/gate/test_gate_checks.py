"""The rules the gate re-derives instead of trusting results.json (see tests/adversarial for whole files)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import onnx
import pytest
from onnx import TensorProto, helper
from sweep_factory import make_latency, make_sweep, make_variant

from qbench.gate.checks import result_problems, skip_possible, timed_batch_sizes
from qbench.recipe.spec import QatSpec, Recipe, VariantSpec
from qbench.results.schema import SweepResults


@pytest.mark.parametrize(
    ("backend", "spec", "possible"),
    [
        ("onnxruntime-cpu", VariantSpec(name="q", precision="int8", calibrator="minmax"), False),
        ("onnxruntime-cuda", VariantSpec(name="h", precision="fp16"), False),
        ("torch-cpu", VariantSpec(name="fp32", precision="fp32"), False),  # the module as it is
        ("torch-cpu", VariantSpec(name="h", precision="bf16"), False),
        ("torch-cpu", VariantSpec(name="q", precision="int8", calibrator="minmax"), True),  # static: no torch form
        ("torch-cpu", VariantSpec(name="q", precision="int8", calibrator="minmax", qat=QatSpec()), True),
        ("torch-cpu", VariantSpec(name="q", precision="int8", calibrator="dynamic"), True),  # model-dependent
        ("torch-cuda", VariantSpec(name="f", precision="fp8", calibrator="minmax"), True),  # GPU-dependent
        ("tensorrt", VariantSpec(name="fp32", precision="fp32"), True),  # the model's ops decide
    ],
)
def test_skipped_only_where_the_backends_rule_can_decline(backend, spec, possible):
    assert skip_possible(backend, spec) is possible


# -- latency points: one per batch size the sweep times ---------------------------------------------

BACKEND = "onnxruntime-cpu"


def small_recipe(tmp_path: Path, *, batch: int | str = "batch", latency: dict[str, Any] | None = None) -> Recipe:
    """A recipe (FP32 and INT8) over a one-layer model whose input's batch axis is `batch` (an int fixes it)."""
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])], "relu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 4])],
    )  # fmt: skip
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(tmp_path / "relu.onnx"))
    raw = {"name": "relu", "task": "classification", "model": {"path": "relu.onnx"},
           "data": {"path": "rows.parquet", "inputs": {"x": "x"}, "label": "y"},
           "variants": [{"name": "int8", "precision": "int8", "calibrator": "minmax"}],
           **({"latency": latency} if latency is not None else {})}  # fmt: skip
    recipe = Recipe.model_validate(raw)
    recipe._source = tmp_path / "recipe.yaml"
    return recipe


def swept(recorded: Any, fp32: tuple[int, ...], int8: tuple[int, ...]) -> SweepResults:
    """Results of FP32 and INT8 timed at those batch sizes (a repeat is a second point), recording `recorded`."""
    variants = [make_variant("fp32", "fp32"), make_variant("int8", "int8")]
    for index, sizes in enumerate((fp32, int8)):
        points = tuple(replace(make_latency({1: 1.0}).points[0], batch_size=size) for size in sizes)
        variants[index] = replace(variants[index], latency=replace(variants[index].latency, points=points))
    results = make_sweep(variants)
    return replace(results, recipe={**results.recipe, "latency": {"batch_sizes": recorded}})


def latency_problems(results: SweepResults, recipe: Recipe, timed: list[int] | None = None) -> list[str]:
    return [p for p in result_problems(results, recipe, None, timed) if "latency" in p]


def test_a_sweep_with_one_point_per_timed_batch_size_has_no_problem(tmp_path):
    recipe = small_recipe(tmp_path)
    assert result_problems(swept([1, 32], (1, 32), (1, 32)), recipe, None, [1, 32]) == []
    assert result_problems(swept([1, 32], (1, 32), (1, 32)), recipe, None) == []  # model not read: by the record


def test_a_batch_size_missing_from_one_variant_is_a_problem_naming_it(tmp_path):
    recipe = small_recipe(tmp_path)
    for timed in ([1, 32], None):
        assert latency_problems(swept([1, 32], (1, 32), (1,)), recipe, timed) == [
            f"int8@{BACKEND}: latency: no point at batch size 32; the sweep times batch sizes 1, 32"
        ]


def test_a_batch_size_missing_everywhere_is_a_problem_for_every_variant(tmp_path):
    recipe = small_recipe(tmp_path, latency={"batch_sizes": [1, 32]})
    problems = latency_problems(swept([1, 32], (1,), (1,)), recipe)
    assert problems == [f"{name}@{BACKEND}: latency: no point at batch size 32; the sweep times batch sizes 1, 32"
                        for name in ("fp32", "int8")]  # fmt: skip


def test_a_batch_size_timed_twice_is_a_problem(tmp_path):
    problems = latency_problems(swept([1, 32], (1, 32), (1, 32, 32)), small_recipe(tmp_path), [1, 32])
    assert problems == [f"int8@{BACKEND}: latency: 2 points at batch size 32, expected one per batch size"]


def test_a_batch_size_the_sweep_does_not_time_is_a_problem(tmp_path):
    problems = latency_problems(swept([1, 32], (1, 32), (1, 16, 32)), small_recipe(tmp_path), [1, 32])
    assert problems == [
        f"int8@{BACKEND}: latency: a point at batch size 16, which the sweep does not time (it times batch sizes 1, 32)"
    ]


def test_a_fixed_batch_is_timed_alone_where_the_recipe_leaves_the_batch_sizes_out(tmp_path):
    """The sweep times a model with a fixed batch at that batch, whatever the recipe's default batch sizes."""
    recipe = small_recipe(tmp_path, batch=8)
    assert timed_batch_sizes(recipe) == [8]
    assert result_problems(swept([8], (8,), (8,)), recipe, None, [8]) == []
    assert result_problems(swept([8], (8,), (8,)), recipe, None) == []  # model not read: one batch, by the record
    assert latency_problems(swept([8], (8,), ()), recipe, [8]) == [
        f"int8@{BACKEND}: latency: no point at batch size 8; the sweep times batch size 8"
    ]


def test_a_record_of_one_batch_size_is_judged_against_the_model(tmp_path):
    """A dynamic model is timed at the recipe's batch sizes: results that record one batch (and time only it)
    are judged by the model when it can be read, and by the recipe when it sets the batch sizes."""
    recipe = small_recipe(tmp_path)
    assert timed_batch_sizes(recipe) == [1, 32]
    cut = swept([1], (1,), (1,))
    assert latency_problems(cut, recipe, timed_batch_sizes(recipe)) == [
        "recipe.latency.batch_sizes: the results record [1], but a sweep of the recipe times batch sizes 1, 32",
        *(f"{name}@{BACKEND}: latency: no point at batch size 32; the sweep times batch sizes 1, 32"
          for name in ("fp32", "int8")),
    ]  # fmt: skip
    explicit = small_recipe(tmp_path, latency={"batch_sizes": [1, 32]})
    assert latency_problems(cut, explicit)[0] == (
        "recipe.latency.batch_sizes: the results record [1], but a sweep of the recipe times batch sizes 1, 32"
    )
    assert latency_problems(swept([1, 4], (1, 4), (1, 4)), recipe)[0] == (
        "recipe.latency.batch_sizes: the results record [1, 4], but a sweep of the recipe times batch sizes 1, 32 "
        "(or, for a model with a fixed batch, that batch alone)"
    )


# -- slices: every result is measured on the same rows ----------------------------------------------


def test_a_slice_one_backend_s_results_lack_is_a_problem_without_the_data(tmp_path):
    """With the data file gone the slices cannot be re-derived, and only the recipe's named slices were required: a
    `by` slice left out of FP32 and the variant on one backend alike went unjudged there (the gate compares each
    variant with FP32 on its own backend). Every result is measured on the same rows, so each holds the slices of
    the first FP32 result, and none it lacks."""
    recipe = small_recipe(tmp_path).model_copy(update={"backends": ["onnxruntime-cpu", "onnxruntime-cuda"]})
    dark = "noisy lighting=dark"

    def without_dark(result):
        return replace(result, accuracy=replace(result.accuracy, slices=result.accuracy.slices[:1]))

    cpu = [make_variant(name, precision) for name, precision in (("fp32", "fp32"), ("int8", "int8"))]
    cuda = [without_dark(make_variant(name, precision, backend="onnxruntime-cuda"))
            for name, precision in (("fp32", "fp32"), ("int8", "int8"))]  # fmt: skip
    results = replace(make_sweep([*cpu, *cuda]), recipe={"latency": {"batch_sizes": [1, 32]}})
    assert result_problems(results, recipe, None, [1, 32]) == [
        f"{name}@onnxruntime-cuda: slice {dark!r} missing (FP32's first result has it: every result is measured on "
        "the same rows)" for name in ("fp32", "int8")]  # fmt: skip
    # the other way round: a slice FP32's first result lacks, where another result has it
    results = replace(make_sweep([*cuda, *cpu]), recipe={"latency": {"batch_sizes": [1, 32]}})
    assert result_problems(results, recipe, None, [1, 32]) == [
        f"{name}@onnxruntime-cpu: slice {dark!r} is not one FP32's first result has (every result is measured on "
        "the same rows)" for name in ("fp32", "int8")]  # fmt: skip
