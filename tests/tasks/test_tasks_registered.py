"""A task registered from outside qbench (this module) is a task like the built-in ones: the recipe loader takes it,
its own metric is in the catalogue (gated, with its direction), and validate -> sweep -> gate run on it."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from task_projects import iris, iris_logits_model, overall, plain_ort, project, run_all, table

from qbench.recipe.spec import load_recipe
from qbench.results.schema import SliceMetrics
from qbench.tasks import TASKS, get_task
from qbench.tasks.base import RowSummary
from qbench.tasks.structured import Structured, StructuredRows
from qbench.validate import catalogue
from qbench.validate.catalogue import METRICS, MetricInfo


@dataclasses.dataclass(frozen=True)
class ScoreRangeRows(StructuredRows):
    def summarise(self, name: str, mask: np.ndarray) -> SliceMetrics:
        summary = super().summarise(name, mask)
        spread = float(np.mean(np.ptp(self.outputs[mask], axis=1))) if mask.any() else float("nan")
        return dataclasses.replace(summary, metrics={**summary.metrics, "score_spread": spread})


class ScoreRange(Structured):
    """Structured's figures and one of its own: the mean spread of each row's scores (max - min)."""

    name = "score_range"
    metric_infos = (*Structured.metric_infos, MetricInfo("score_spread", True, "mean (max - min) of a row's scores"))
    default_gate_metric = "score_spread"

    def rows(self, outputs: np.ndarray, reference: np.ndarray, labels: np.ndarray | None, *,
             probabilities: bool | None = None) -> RowSummary:  # fmt: skip
        rows = super().rows(outputs, reference, labels)
        assert isinstance(rows, StructuredRows)
        return ScoreRangeRows(rows.outputs, rows.reference, rows.agrees)


@pytest.fixture
def registered(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(TASKS, "_entries", dict(TASKS._entries))
    monkeypatch.setattr(METRICS, "_entries", dict(METRICS._entries))
    TASKS.register("score_range", ScoreRange())


@pytest.mark.slow
def test_a_task_registered_by_a_plugin_runs_end_to_end(registered, tmp_path, capsys) -> None:
    features, labels = iris()
    recipe = project(tmp_path, iris_logits_model(), table(features, labels), task="score_range",
                     gate={"max_drop": 100.0, "max_slice_drop": 100.0})  # fmt: skip
    loaded = load_recipe(recipe)
    assert loaded.task == "score_range" and loaded.gate.metric == "score_spread"
    assert METRICS["score_spread"].higher_is_better
    results, _ = run_all(recipe, capsys)
    expected = float(np.mean(np.ptp(plain_ort(tmp_path / "model.onnx", {"x": features})["logits"], axis=1)))
    assert overall(results)["score_spread"] == pytest.approx(expected, rel=1e-5)
    assert catalogue.drop("score_spread", 2.0, 1.5) == 0.5  # higher is better: a lower spread is a drop


def test_registering_a_task_whose_metric_contradicts_a_known_one_is_refused(registered) -> None:
    class Backwards(Structured):
        name = "backwards"
        metric_infos = (MetricInfo("score_spread", False, "the same name, the other direction"),)

    from qbench.errors import QbenchError

    with pytest.raises(QbenchError, match="'score_spread' is already registered with another direction"):
        TASKS.register("backwards", Backwards())
    assert "backwards" not in TASKS and get_task("score_range").name == "score_range"


def test_a_label_list_is_taken_by_the_tasks_that_declare_they_read_label_columns(registered, tmp_path) -> None:
    from qbench.errors import QbenchError

    class ScoreColumns(ScoreRange):
        name = "score_columns"
        reads_label_columns = True

    TASKS.register("score_columns", ScoreColumns())
    features, labels = iris()
    rows = table(features, labels, z=labels)
    for task in ("score_range", "score_columns"):
        project(tmp_path / task, iris_logits_model(), rows, task=task, data={"label": ["y", "z"]},
                gate={"max_drop": 100.0, "max_slice_drop": 100.0})  # fmt: skip
    with pytest.raises(QbenchError, match="read by task multilabel / score_columns only; expected one label column "
                                          "for task 'score_range'"):  # fmt: skip
        load_recipe(tmp_path / "score_range" / "recipe.yaml")
    assert load_recipe(tmp_path / "score_columns" / "recipe.yaml").data.label == ["y", "z"]
