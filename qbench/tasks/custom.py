"""A recipe's own metrics, `metrics: [{name, function: 'module:function', higher_is_better}]`.

Trust model, as for a PyTorch factory: the function is code the user chose to run, imported
like any Python import with the recipe's folder first on `sys.path`. It is called once per
slice (and overall) and per evaluated output as `function(outputs, labels)`, or
`function(outputs, labels, reference_outputs)` when it takes three parameters; labels are
None without data.label. It returns one float. A metric naming `outputs: [boxes, scores]` is
called once per slice over those outputs together, `outputs` and `reference_outputs` then dicts
name -> array of the same rows: a detector's mAP needs its boxes and scores at once. It sees only
the rows where FP32's outputs (all those it reads) are finite, for every result alike
(qbench.validate.accuracy).
"""

from __future__ import annotations

import importlib
import inspect
from typing import TYPE_CHECKING

from qbench.errors import RecipeError, did_you_mean
from qbench.tasks.base import CustomMetric
from qbench.user_code import first_on_sys_path

if TYPE_CHECKING:  # pragma: no cover
    from qbench.recipe import Recipe


def load_custom_metrics(recipe: Recipe) -> tuple[CustomMetric, ...]:
    """Import every metric function the recipe names; RecipeError naming `metrics[i].function` if one is unusable."""
    loaded = []
    for index, spec in enumerate(recipe.metrics):
        field = f"metrics[{index}].function"
        module_name, _, attribute = spec.function.partition(":")
        importlib.invalidate_caches()  # the module may have been written a moment ago
        with first_on_sys_path(recipe.base_dir):
            try:
                module = importlib.import_module(module_name)
            except Exception as exc:  # noqa: BLE001 - a broken user module is a recipe problem
                raise RecipeError(recipe.source, field, f"importing {module_name!r} failed: {exc}") from None
        function = getattr(module, attribute, None)
        if not callable(function):
            hint = did_you_mean(attribute, [n for n in dir(module) if not n.startswith("_")])
            raise RecipeError(recipe.source, field, f"module {module_name!r} has no function {attribute!r}{hint}")
        try:
            parameters = len(inspect.signature(function).parameters)
        except (TypeError, ValueError):
            parameters = 2
        if parameters not in (2, 3):
            message = f"{spec.function} takes {parameters} parameters; expected (outputs, labels[, reference_outputs])"
            raise RecipeError(recipe.source, field, message)
        loaded.append(CustomMetric(spec.name, function, spec.higher_is_better, wants_reference=parameters == 3,
                                   outputs=tuple(spec.outputs or ())))  # fmt: skip
    return tuple(loaded)
