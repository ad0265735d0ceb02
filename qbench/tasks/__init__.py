"""Tasks: how a model's outputs are read and judged. One module per task, registered here by name.

A new task is a module with a `qbench.tasks.base.Task` subclass and one `TASKS.register` line.
Every registered task's metrics (name, direction) are in the metric catalogue
(`qbench.validate.catalogue.METRICS`) that the gate, the report and the frontier read: the built-in tasks' once this
package is imported, a task registered later (a plugin, a test) the moment it is registered.
"""

from __future__ import annotations

from qbench.errors import QbenchError, expected_one_of
from qbench.registry import Registry
from qbench.tasks.base import CustomMetric, LabelError, Task
from qbench.validate.catalogue import METRICS


class TaskRegistry(Registry[Task]):
    """The task registry, which keeps the metric catalogue in step: once the built-in (lazy) entries below have
    put their metrics there, a task registered is imported and its metrics added first (a metric at odds with a
    registered one's direction or range refuses the task)."""

    def __init__(self) -> None:
        super().__init__("task")
        self.catalogued = False

    def _add(self, name: str, target: Task | str) -> None:
        if self.catalogued:
            target = self.resolve(target)
            _catalogue(target)
        super()._add(name, target)


def _catalogue(task: Task) -> None:
    for info in task.metric_infos:
        METRICS.add(info)


TASKS = TaskRegistry()
TASKS.register("classification", "qbench.tasks.classification:CLASSIFICATION")
TASKS.register("embedding", "qbench.tasks.embedding:EMBEDDING")
TASKS.register("regression", "qbench.tasks.regression:REGRESSION")
TASKS.register("multilabel", "qbench.tasks.multilabel:MULTILABEL")
TASKS.register("structured", "qbench.tasks.structured:STRUCTURED")
TASKS.register("span", "qbench.tasks.span:SPAN")

UNSUPPORTED_TASKS = ("detection", "segmentation", "generation", "ranking")
"""Structured-output tasks people ask for by name; they get 'not supported' (with the task that takes them,
'structured') rather than 'unknown'."""


def get_task(name: str) -> Task:
    """The task registered as `name`; a clear error for structured-output tasks and unknown names."""
    if name in UNSUPPORTED_TASKS:
        raise QbenchError(
            f"task {name!r} is not supported as such: use task 'structured', which hands each row's outputs and "
            "label to your own metrics (recipe `metrics:`) and gates on them"
        )
    if name not in TASKS:
        raise QbenchError(f"task: {expected_one_of(name, TASKS.names())}")
    return TASKS.get(name)


def gate_metric_names(task: str) -> list[str]:
    """The metrics `task` reports (any of them can be gated)."""
    return [info.name for info in get_task(task).metric_infos]


def _catalogue_built_in() -> None:
    for name in TASKS.names():
        _catalogue(TASKS.get(name))
    TASKS.catalogued = True


_catalogue_built_in()

__all__ = ["TASKS", "CustomMetric", "LabelError", "Task", "gate_metric_names", "get_task"]
