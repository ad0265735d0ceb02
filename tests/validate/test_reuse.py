"""Outputs known for some rows are taken, the others run: the same outputs as running every row, or every row runs."""

from __future__ import annotations

import numpy as np
import pytest

from qbench.backends import get_backend
from qbench.preflight.prepare import prepare
from qbench.recipe.spec import VariantSpec, load_recipe
from qbench.validate import measure as measure_module
from qbench.validate.measure import Rows, measure
from qbench.validate.outputs import row_count
from qbench.validate.reuse import KnownOutputs, with_known
from qbench.variants import BuildContext, BuiltVariant, build_variant
from tests.explain.test_sensitivity import INT8, write_fragile_project


def _doubling(fed_rows: list):
    def run(feeds, batch_size):
        fed_rows.append(feeds["x"][:, 0].tolist())
        return {"y": feeds["x"] * 2.0}

    return run


def test_only_the_rows_not_known_are_run_and_every_row_comes_back_in_its_place():
    feeds = {"x": np.arange(10, dtype=np.float64).reshape(5, 2)}
    fed: list = []
    known = KnownOutputs(np.array([1, 3]), {"y": np.array([[-1.0, -1.0], [-3.0, -3.0]])})  # marked: taken, not run
    joined = with_known(_doubling(fed), feeds, 2, known)
    assert fed == [[0.0, 4.0, 8.0]]  # rows 0, 2 and 4 (their first values), once
    assert joined["y"][:, 0].tolist() == [0.0, -1.0, 8.0, -3.0, 16.0]


def test_known_outputs_of_another_shape_are_not_taken():
    feeds = {"x": np.arange(10, dtype=np.float64).reshape(5, 2)}
    fed: list = []
    joined = with_known(_doubling(fed), feeds, 2, KnownOutputs(np.array([1]), {"y": np.zeros((1, 3))}))
    assert fed[-1] == [0.0, 2.0, 4.0, 6.0, 8.0]  # every row run again
    assert np.array_equal(joined["y"], feeds["x"] * 2.0)


def test_the_rows_of_a_measurement_of_every_row_become_a_subsets_known_outputs():
    known = KnownOutputs.of_rows({"y": np.arange(6) * 10}, np.array([2, 5]))
    assert known.indices.tolist() == [0, 1] and known.outputs["y"].tolist() == [20, 50] and known.count == 2


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    return prepare(load_recipe(write_fragile_project(tmp_path_factory.mktemp("reuse"), [INT8])), track=False)


def _counting(monkeypatch) -> list[int]:
    counts: list[int] = []
    real = measure_module.run_outputs

    def counted(runner, feeds, *args, **kwargs):
        counts.append(row_count(feeds))
        return real(runner, feeds, *args, **kwargs)

    monkeypatch.setattr(measure_module, "run_outputs", counted)
    return counts


def test_a_variant_whose_rows_do_not_follow_their_batch_takes_them_and_gives_every_rows_outputs(prepared, monkeypatch):
    """FP32 measured as a variant against itself: its rows are checked and do not follow their batch."""
    backend = get_backend("onnxruntime-cpu")
    fp32 = BuiltVariant("fp32", "fp32", prepared.source.onnx_path)
    reference = measure(backend, fp32, prepared).reference
    rows, screen = Rows.evaluation(prepared), np.arange(0, 200, 4)
    screened = measure(backend, fp32, prepared, rows=rows.subset(screen))  # its screen: other batches
    assert screened.outputs is not None
    counts = _counting(monkeypatch)
    whole = measure(backend, fp32, prepared, rows=rows, reference=reference)
    run_whole = sum(counts)
    taken = measure(backend, fp32, prepared, rows=rows, reference=reference,
                    known=KnownOutputs(screen, screened.outputs))  # fmt: skip
    assert whole.rows_independent and taken.rows_independent
    assert sum(counts) - run_whole == run_whole - len(screen)  # the 50 known rows were not run
    assert all(np.array_equal(whole.outputs[k], taken.outputs[k]) for k in whole.outputs)
    assert taken.result.accuracy == whole.result.accuracy


def test_a_variant_whose_rows_follow_their_batch_runs_every_row_as_without_known_outputs(prepared, tmp_path):
    """Dynamic INT8 takes each batch's own range: outputs known from other batches are not taken (marked here: zeros,
    which no run gives)."""
    backend = get_backend("onnxruntime-cpu")
    ctx = BuildContext(prepared.source.onnx_path, tmp_path, prepared.calibration_batches)
    dynamic = build_variant(VariantSpec(name="dyn", precision="int8", calibrator="dynamic"), ctx)
    reference = measure(backend, BuiltVariant("fp32", "fp32", prepared.source.onnx_path), prepared).reference
    screen = np.arange(0, 200, 4)
    marked = KnownOutputs(screen, {k: np.zeros_like(v[screen]) for k, v in reference.outputs.items()})
    whole = measure(backend, dynamic, prepared, reference=reference)
    taken = measure(backend, dynamic, prepared, reference=reference, known=marked)
    assert not whole.rows_independent and not taken.rows_independent
    assert all(np.array_equal(whole.outputs[k], taken.outputs[k]) for k in whole.outputs)
    assert taken.result.accuracy == whole.result.accuracy
