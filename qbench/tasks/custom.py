"""A recipe's own metrics, `metrics: [{name, function: 'module:function', higher_is_better}]`.

Trust model, as for a PyTorch factory: the function is code the user chose to run, imported
like any Python import with the recipe's folder first on `sys.path`. It is called once per
slice (and overall) and per evaluated output as `function(outputs, labels)`, or
`function(outputs, labels, reference_outputs)` when it takes three positional parameters; labels
are None without data.label. A parameter named `inputs` (after those) is given, by keyword, the
model inputs of the same rows: a dict input name -> array, as the model was fed (a text column's
token ids). It returns one float. A metric naming `outputs: [boxes, scores]` is
called once per slice over those outputs together, `outputs` and `reference_outputs` then dicts
name -> array of the same rows: a detector's mAP needs its boxes and scores at once. It sees only
the rows where FP32's outputs (all those it reads) are finite, for every result alike
(qbench.validate.accuracy). A parameter qbench does not pass is refused when the recipe is loaded.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from qbench.errors import RecipeError, did_you_mean
from qbench.tasks.base import INPUTS_PARAMETER, CustomMetric
from qbench.user_code import first_on_sys_path

if TYPE_CHECKING:  # pragma: no cover
    from qbench.recipe.spec import Recipe

SIGNATURE = f"(outputs, labels[, reference_outputs][, {INPUTS_PARAMETER}])"
_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


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
        problem, wants_reference, wants_inputs = parameters_taken(function)
        if problem:
            raise RecipeError(recipe.source, field, f"{spec.function} {problem}; expected {SIGNATURE}")
        loaded.append(CustomMetric(spec.name, function, spec.higher_is_better, wants_reference=wants_reference,
                                   outputs=tuple(spec.outputs or ()), wants_inputs=wants_inputs))  # fmt: skip
    return tuple(loaded)


def parameters_taken(function: Callable[..., Any]) -> tuple[str | None, bool, bool]:
    """(why qbench cannot call `function`, or None; whether it takes reference_outputs; whether it takes inputs).

    Its positional parameters (a `*args` counting as one) are outputs, labels and optionally reference_outputs,
    whatever their names, as before; a parameter named `inputs` after the first two (positional-or-keyword or
    keyword-only) is given the rows' model inputs by keyword. Any other parameter is one qbench never passes: a
    typo of `inputs` (with a default it would silently never get them) or a fourth positional one."""
    try:
        parameters = list(inspect.signature(function).parameters.values())
    except (TypeError, ValueError):  # a builtin without a signature: called as before, with two arguments
        return None, False, False
    inputs = next((p for p in parameters[2:] if p.name == INPUTS_PARAMETER and p.kind not in
                   (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.VAR_POSITIONAL,
                    inspect.Parameter.VAR_KEYWORD)), None)  # fmt: skip
    rest = [p for p in parameters if p is not inputs and p.kind != inspect.Parameter.VAR_KEYWORD]
    positional = [p for p in rest if p.kind in _POSITIONAL or p.kind == inspect.Parameter.VAR_POSITIONAL]
    unknown = [p for p in rest if p.kind == inspect.Parameter.KEYWORD_ONLY] + positional[3:]
    if unknown:
        hint = did_you_mean(unknown[0].name, [INPUTS_PARAMETER])
        return f"takes a parameter {unknown[0].name!r} qbench does not pass{hint}", False, False
    if len(positional) < 2:
        return f"takes {len(positional)} positional parameter{'s' if len(positional) != 1 else ''}", False, False
    if inputs is not None and inputs.kind in _POSITIONAL and inputs is not parameters[len(positional)]:
        problem = f"takes {INPUTS_PARAMETER!r} before {positional[-1].name!r}: it comes after the positional ones"
        return problem, False, False
    return None, len(positional) == 3, inputs is not None
