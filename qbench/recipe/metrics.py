"""The recipe's metrics: its own (`metrics:`), and which one the gate judges (`gate.metric` and its default).

A gate naming no metric gates the task's own headline one (accuracy, mae, micro_f1, cosine), or, for a task judged
by the recipe's own metrics only (`structured`), the first of them. Metric names are 'output/'-prefixed when
several outputs are evaluated; a metric of several outputs (`metrics[i].outputs`) belongs to none and keeps its name.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from pydantic import Field, field_validator

from qbench.errors import expected_one_of
from qbench.recipe.variants import Name
from qbench.techniques.options import StrictConfig

if TYPE_CHECKING:
    from qbench.recipe.spec import Recipe
    from qbench.validate.catalogue import MetricInfo


class MetricSpec(StrictConfig):
    """A recipe's own metric: `function(outputs, labels[, reference_outputs][, inputs]) -> float`, per slice: once
    per evaluated output, or, with `outputs`, once over those outputs together (each argument a dict name -> array);
    `inputs`, when the function declares it, is a dict model input name -> array of the same rows."""

    name: Name
    function: str = Field(description="'package.module:function', imported as Python code (recipe folder first)")
    higher_is_better: bool = Field(description="the metric's direction, for drops and the gate")
    data_units: bool = Field(False, description="in the data's units (an error, a distance): the gate's default "
                             "tolerances are then shares of FP32's figure, as for mae (qbench.gate.tolerance)")
    outputs: list[str] | None = Field(
        None, description="evaluated outputs the function reads together (dicts name -> array); default: each alone"
    )

    @field_validator("outputs")
    @classmethod
    def _distinct_outputs(cls, v: list[str] | None) -> list[str] | None:
        if v is not None and (not v or len(set(v)) != len(v)):
            raise ValueError("expected a non-empty list of distinct output names")
        return v

    @field_validator("function")
    @classmethod
    def _target(cls, v: str) -> str:
        if not re.fullmatch(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*", v):
            raise ValueError(f"got {v!r}, expected 'package.module:function'")
        return v


def default_gate_metric(data: Any) -> Any:
    """The recipe's raw mapping with `gate.metric` filled in when the gate names none: the task's headline metric,
    or the first custom metric for a task that has none. A fixed 'accuracy' refused every recipe of a task without
    it whose gate left the metric out. With several evaluated outputs a per-output metric's name is prefixed, so the
    recipe must name which one it gates (check_metrics says so)."""
    from qbench.tasks import TASKS

    if not isinstance(data, dict):
        return data
    task, gate = data.get("task", "classification"), data.get("gate", {})
    if not (isinstance(task, str) and task in TASKS and isinstance(gate, dict) and "metric" not in gate
            and gate.get("metrics") is None):  # gate.metrics: its first entry is gate.metric
        return data
    metric, per_output = TASKS.get(task).default_gate_metric, not TASKS.get(task).together
    if metric is None:
        metric, per_output = _first_custom_metric(data.get("metrics"))
    model = data.get("model")
    outputs = model.get("outputs") if isinstance(model, dict) else None
    if metric is None or (per_output and isinstance(outputs, list) and len(outputs) > 1):
        return data  # no default, or one per output: the recipe names the metric it gates
    return {**data, "gate": {**gate, "metric": metric}}


def _first_custom_metric(metrics: Any) -> tuple[str | None, bool]:
    """The name of the recipe's first custom metric as written (None when there is none: the validators say why),
    and whether it is computed per output (no `outputs` of its own)."""
    first = metrics[0] if isinstance(metrics, list) and metrics else None
    name = first.get("name") if isinstance(first, dict) else None
    return (name if isinstance(name, str) else None), not (isinstance(first, dict) and first.get("outputs"))


def custom_metric_infos(metrics: list[MetricSpec]) -> list[MetricInfo]:
    """The recipe's own metrics with their directions."""
    from qbench.validate.catalogue import MetricInfo

    return [MetricInfo(m.name, m.higher_is_better, m.function, custom=True, data_units=m.data_units) for m in metrics]


def check_metrics(recipe: Recipe) -> None:
    """ValueError (a recipe error naming the field) for a task that needs metrics of its own and has none, a metric
    reading an output the recipe does not evaluate, a metric name taken, or a gate metric the results will not
    carry. Custom metrics' directions join the metric catalogue."""
    from qbench.tasks import get_task

    if get_task(recipe.task).default_gate_metric is None and not recipe.metrics:
        raise ValueError(f"metrics: task {recipe.task!r} is judged by the recipe's own metrics; expected at least one "
                         "(`metrics: [{name, function: 'module:function', higher_is_better}]`)")  # fmt: skip
    _check_metric_outputs(recipe)
    allowed = metric_names(recipe)
    outputs = recipe.model.outputs or []
    if "metric" not in recipe.gate.model_fields_set and len(outputs) > 1 and not get_task(recipe.task).together:
        # no default: one set per evaluated output
        raise ValueError(f"gate.metric: not set, and task {recipe.task!r} evaluates several outputs "
                         f"({', '.join(outputs)}), each "
                         f"with its own metrics named 'output/metric'; expected one of {', '.join(sorted(allowed))}")
    for index, metric in enumerate(recipe.gate.gated_metrics):
        field = f"gate.metrics[{index}].metric" if recipe.gate.metrics else "gate.metric"
        if metric not in allowed:
            raise ValueError(f"{field}: {expected_one_of(metric, allowed)} for task {recipe.task!r}")


def _check_metric_outputs(recipe: Recipe) -> None:
    """A metric of several outputs reads outputs the recipe names for evaluation (model.outputs, or model.output): an
    output qbench picks itself is only known once the model is read, and a typo must not wait for the sweep."""
    model = recipe.model
    evaluated = model.outputs or ([model.output] if model.output is not None else [])
    for index, metric in enumerate(recipe.metrics):
        for name in metric.outputs or []:
            if not evaluated:
                raise ValueError(f"metrics[{index}].outputs: {name!r} is not an evaluated output; expected the "
                                 "outputs a metric reads listed in model.outputs (now none)")  # fmt: skip
            if name not in evaluated:
                raise ValueError(f"metrics[{index}].outputs: not an output the recipe evaluates (model.outputs): "
                                 f"{expected_one_of(name, evaluated)}")  # fmt: skip


def metric_names(recipe: Recipe) -> list[str]:
    """Every metric name results will carry: the task's and the custom ones, 'output/'-prefixed when several outputs
    are evaluated (a metric of several outputs keeps its name). Custom metrics' directions join the catalogue."""
    from qbench.tasks import gate_metric_names, get_task
    from qbench.validate.catalogue import METRICS

    names, joint = list(gate_metric_names(recipe.task)), []
    if get_task(recipe.task).together:  # the task's metrics are of its outputs together: unprefixed
        names, joint = [], names
    for index, info in enumerate(custom_metric_infos(recipe.metrics)):
        if (info.name in METRICS and not METRICS[info.name].custom) or info.name in names + joint:
            raise ValueError(f"metrics[{index}].name: {info.name!r} is taken by a built-in or earlier metric")
        METRICS.add(info, replace=True)
        (joint if recipe.metrics[index].outputs else names).append(info.name)
    outputs = recipe.model.outputs or []
    return ([f"{o}/{n}" for o in outputs for n in names] if len(outputs) > 1 else names) + joint
