"""Outputs as arrays: class maps become score matrices, several outputs are collected per batch."""

from __future__ import annotations

import tracemalloc
from collections.abc import Mapping

import numpy as np
import pytest

from qbench.errors import QbenchError
from qbench.validate.outputs import as_array, maps_to_matrix, run_outputs


def test_integer_class_keys_are_the_columns() -> None:
    matrix = maps_to_matrix([{5: 0.25, 1: 0.75}, {1: 0.1, 5: 0.9}])
    assert matrix.shape == (2, 6)
    assert matrix[:, 1].tolist() == pytest.approx([0.75, 0.1]) and matrix[:, 5].tolist() == pytest.approx([0.25, 0.9])
    assert matrix.argmax(axis=1).tolist() == [1, 5]  # the argmax is the class key itself


def test_negative_integer_class_keys_take_their_sorted_position() -> None:
    """A -1 / +1 model's map was refused ('a negative class key'); its keys are now columns in sorted order."""
    matrix = maps_to_matrix([{1: 0.8, -1: 0.2}, {-1: 0.6, 1: 0.4}])
    assert matrix.tolist() == [pytest.approx([0.2, 0.8]), pytest.approx([0.6, 0.4])]  # -1, 1


def test_string_class_keys_take_their_sorted_position() -> None:
    matrix = maps_to_matrix([{"dog": 0.3, "cat": 0.7}])
    assert matrix.tolist() == [pytest.approx([0.7, 0.3])]  # cat, dog


def test_structured_values_are_refused() -> None:
    with pytest.raises(QbenchError, match="output 'boxes' is not a tensor or a sequence of maps"):
        as_array([np.zeros(2), np.zeros(3)], "boxes")


class _Runner:
    """Returns [row ids as int64, a {class: score} map per row] for a batch of `x`."""

    def run(self, feeds: Mapping[str, np.ndarray]) -> list:
        x = feeds["x"]
        return [x.astype(np.int64), [{0: 1.0 - float(v) / 10, 1: float(v) / 10} for v in x]]

    def describe(self) -> dict:
        return {}

    def close(self) -> None:
        pass


def test_run_outputs_concatenates_each_chosen_output_over_batches() -> None:
    feeds = {"x": np.arange(5, dtype=np.float32)}
    outputs = run_outputs(_Runner(), feeds, 2, {"ids": 0, "probabilities": 1})
    assert outputs["ids"].tolist() == [0, 1, 2, 3, 4]
    assert outputs["probabilities"][:, 1].tolist() == pytest.approx([0.0, 0.1, 0.2, 0.3, 0.4])
    with pytest.raises(QbenchError, match="output index 2 is out of range"):
        run_outputs(_Runner(), feeds, 2, {"nope": 2})


class _StringLabels(_Runner):
    """Returns a string label per row, as an ONNX-ML classifier with classlabels_strings does: 'no' below 3."""

    def run(self, feeds: Mapping[str, np.ndarray]) -> list:
        return [np.array(["no" if v < 3 else "yes" if v < 6 else "maybe" for v in feeds["x"]], dtype=object)]


def test_string_labels_become_their_position_in_the_outputs_class_table() -> None:
    outputs = run_outputs(_StringLabels(), {"x": np.arange(5, dtype=np.float32)}, 2, {"label": 0},
                          tables={"label": ("yes", "no")})  # fmt: skip
    assert outputs["label"].dtype == np.int64 and outputs["label"].tolist() == [1, 1, 1, 0, 0]
    with pytest.raises(QbenchError,
                       match=r"output 'label' gave 'maybe', none of the classes its graph states \(yes, no\)"):
        run_outputs(_StringLabels(), {"x": np.arange(7, dtype=np.float32)}, 4, {"label": 0},
                    tables={"label": ("yes", "no")})  # fmt: skip


class _FixedBatch(_Runner):
    """A model that takes batches of exactly 3 rows, and counts the rows it was fed."""

    fed = 0

    def run(self, feeds: Mapping[str, np.ndarray]) -> list:
        assert len(feeds["x"]) == 3, f"a batch of {len(feeds['x'])} rows"
        self.fed += 3
        return super().run(feeds)


def test_whole_batches_fill_the_last_one_and_keep_only_the_rows_fed() -> None:
    """7 rows in batches of exactly 3: rows 6, 6, 6 make the last batch; only row 6's outputs are kept."""
    runner = _FixedBatch()
    outputs = run_outputs(runner, {"x": np.arange(7, dtype=np.float32)}, 3, {"ids": 0, "probabilities": 1}, whole=True)
    assert runner.fed == 9
    assert outputs["ids"].tolist() == [0, 1, 2, 3, 4, 5, 6]
    assert outputs["probabilities"][:, 1].tolist() == pytest.approx([0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6])
    with pytest.raises(QbenchError, match="^a batch of 1 row failed: AssertionError: a batch of 1 rows") as raised:
        run_outputs(_FixedBatch(), {"x": np.arange(7, dtype=np.float32)}, 3, {"ids": 0})
    assert isinstance(raised.value.__cause__, AssertionError)  # the runner's own error stays the cause


class _Aggregating(_Runner):
    """One output row per batch (a mean over the batch), or a scalar: not one row per input row."""

    def run(self, feeds: Mapping[str, np.ndarray]) -> list:
        x = feeds["x"]
        return [x.mean(keepdims=True), np.float32(x.sum())]


def test_an_output_that_is_not_one_row_per_input_row_is_refused_by_name() -> None:
    feeds = {"x": np.arange(5, dtype=np.float32)}
    with pytest.raises(QbenchError, match=r"output 'mean' gave 1 row for a batch of 2 input rows: qbench reads one "
                                          r"output row per input row \(the first axis is the batch\)"):  # fmt: skip
        run_outputs(_Aggregating(), feeds, 2, {"mean": 0})
    with pytest.raises(QbenchError, match="output 'total' gave a scalar for a batch of 2 input rows"):
        run_outputs(_Aggregating(), feeds, 2, {"total": 1})
    assert run_outputs(_Aggregating(), {"x": np.ones(1, dtype=np.float32)}, 4, {"mean": 0})["mean"].tolist() == [1.0]


class _Wide(_Runner):
    """A (rows, 1000) float32 score matrix per batch, fresh each call, as a runtime returns it."""

    def run(self, feeds: Mapping[str, np.ndarray]) -> list:
        x = feeds["x"]
        return [np.sin(np.outer(x, np.arange(1000, dtype=np.float32))).astype(np.float32)]


def test_batches_are_written_into_one_array_never_a_list_and_its_join() -> None:
    """Gathering a list of batches and joining it held twice the output matrix; the array is now allocated once."""
    feeds = {"x": np.arange(4000, dtype=np.float32)}
    runner = _Wide()
    expected = np.concatenate([runner.run({"x": feeds["x"][s : s + 300]})[0] for s in range(0, 4000, 300)])
    tracemalloc.start()
    try:
        got = run_outputs(runner, feeds, 300, {"scores": 0})["scores"]
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert got.dtype == expected.dtype and got.shape == expected.shape and np.array_equal(got, expected)
    assert peak < 1.5 * expected.nbytes  # the matrix (16 MB) and a batch or two, not the matrix twice


class _GrowingMaps(_Runner):
    """{class: score} maps whose classes grow from batch to batch: rows 0-1 know classes 0-1, row 4 class 4."""

    def run(self, feeds: Mapping[str, np.ndarray]) -> list:
        return [[{int(v): 1.0} for v in feeds["x"]]]


def test_a_later_wider_batch_widens_the_earlier_rows_with_zeros() -> None:
    scores = run_outputs(_GrowingMaps(), {"x": np.arange(5, dtype=np.float32)}, 2, {"p": 0})["p"]
    assert scores.dtype == np.float32 and scores.tolist() == np.eye(5, dtype=np.float32).tolist()


class _RaggedRows(_Runner):
    def run(self, feeds: Mapping[str, np.ndarray]) -> list:
        return [np.zeros((len(feeds["x"]), 2, int(feeds["x"][0]) + 1), dtype=np.float32)]


def test_rows_whose_shape_changes_between_batches_are_refused_by_name() -> None:
    with pytest.raises(QbenchError, match=r"output 'seq' gave rows of shape \[2, 3\] in one batch and \[2, 1\] in an "
                                          r"earlier one"):  # fmt: skip
        run_outputs(_RaggedRows(), {"x": np.arange(4, dtype=np.float32)}, 2, {"seq": 0})


class _ComputedWidth(_Runner):
    """A tensor whose width is computed from the data, as a TopK keeping the scores above a threshold: each batch
    returns its rows' values above 1, as many as the batch's largest count."""

    def run(self, feeds: Mapping[str, np.ndarray]) -> list:
        x = feeds["x"]
        return [np.tile(np.arange(2, 2 + int(x.max()), dtype=np.float32), (len(x), 1))]


def test_a_tensor_whose_width_changes_between_batches_is_refused_not_zero_filled() -> None:
    """Zero-filled to the widest batch, a missing value (a detection a batch did not keep) read as a value of 0, and
    a variant dropping it agreed with FP32 there; only a sequence of class maps is widened so."""
    with pytest.raises(QbenchError, match=r"output 'top' gave rows of shape \[3\] in one batch and \[1\] in an earlier "
                                          r"one: its rows must have one shape; "
                                          r"qbench compares outputs row by row"):  # fmt: skip
        run_outputs(_ComputedWidth(), {"x": np.arange(4, dtype=np.float32)}, 2, {"top": 0})
