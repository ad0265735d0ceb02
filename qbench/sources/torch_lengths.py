"""Which axes of a PyTorch source's inputs vary in length with the recipe's data, beside the batch.

The TorchScript exporter traces forward() on example inputs of the recipe's shapes (`model.example_inputs`): an axis
keeps the example's size in the exported graph unless it is declared dynamic, and axis 0, the batch, always is. A text
column padded `longest` (`data.inputs.<column>.tokenizer.padding`) gives each set of rows its own length (evaluation
and calibration rows, each padded to its own longest row), and timing cuts each batch back to its own longest row, as
a server pads it: the token axis (1) of every input its tokenizer feeds is exported dynamic as well. `padding:
max_length` feeds every row at one length, which the example's must then be (the feeds refuse another).

Such an export must compute what forward() computes at lengths other than the example's, not only at it: the tracer
records a length it reads as a Python number (`x.view(b, 16, -1)`, `int(x.size(1))`, a loop over `range(x.shape[1])`)
as a constant. `qbench.sources.torch_export` checks it at OTHER_LENGTHS and refuses it, naming the padding field.
"""

from __future__ import annotations

from collections.abc import Mapping

from qbench.recipe.data import TextInputSpec
from qbench.recipe.spec import Recipe

TOKEN_AXIS = 1


def dynamic_lengths(recipe: Recipe, shapes: Mapping[str, tuple[int, ...]]) -> tuple[dict[str, dict[int, str]], str]:
    """Model input -> {axis: dim name} for the axes beyond the batch that the recipe's rows vary along (the token
    axis of the (rows, tokens) inputs a `padding: longest` text column feeds), and the recipe field that makes them
    vary ("" when none does). `shapes`: the example shape of every model input."""
    from qbench.data.text import tokenizer_field, tokenizer_input_names

    axes: dict[str, dict[int, str]] = {}
    field = ""
    for column, target in recipe.data.inputs.items():
        if not isinstance(target, TextInputSpec) or target.tokenizer.padding != "longest":
            continue
        produced = tokenizer_input_names(target.tokenizer, recipe_file=recipe.source, column=column)
        fed = [name for name in produced if len(shapes.get(name, ())) == TOKEN_AXIS + 1]
        for name in fed:
            axes[name] = {TOKEN_AXIS: f"{column}_tokens"}
        if fed and not field:
            field = tokenizer_field(column, "padding")
    return axes, field


def other_lengths(example: int) -> list[int]:
    """Lengths to check an export at besides the example's: one shorter (where there is one) and one longer, neither
    a multiple of it, so a length traced as a constant cannot fit by chance."""
    return [length for length in (example // 2 + 1, example + 3) if length != example]
