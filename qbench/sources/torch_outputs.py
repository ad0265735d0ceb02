"""What a PyTorch module's forward() returns, read the way the export writes it: one flat list of tensors (the
exported outputs, in order) and the names forward() itself gives them (a dict's keys, a namedtuple's fields)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from qbench.errors import QbenchError

if TYPE_CHECKING:  # pragma: no cover
    import torch


def own_names(outputs: Any, count: int) -> tuple[str, ...] | None:
    """The names forward() gives its tensors (a dict's keys, a namedtuple's fields), in order; None when unnamed."""
    if isinstance(outputs, Mapping) and len(outputs) == count:
        return tuple(str(key) for key in outputs)
    fields = getattr(outputs, "_fields", None)
    if isinstance(outputs, tuple) and fields is not None and len(fields) == count:
        return tuple(str(field) for field in fields)
    return None


def flatten_outputs(outputs: Any, _at: str = "") -> list[torch.Tensor]:
    """forward()'s result as a flat list of tensors, in the order of the exported outputs (`output_names`)."""
    import torch  # only called on what a module returned: torch is loaded

    if isinstance(outputs, torch.Tensor):
        return [outputs]
    if isinstance(outputs, Mapping):
        return [t for key, value in outputs.items() for t in flatten_outputs(value, f"{_at}[{key!r}]")]
    if isinstance(outputs, (list, tuple)):
        return [t for index, value in enumerate(outputs) for t in flatten_outputs(value, f"{_at}[{index}]")]
    if outputs is None:
        return []
    if _at:  # an item of what forward() returned
        raise QbenchError(f"model.torch: forward()'s output{_at} is a {type(outputs).__name__}; expected every item "
                          "it returns to be a tensor (or None): return a number as a tensor, or leave it out")
    raise QbenchError(f"model.torch: forward() returned a {type(outputs).__name__}; expected a tensor, or a tuple, "
                      "list or dict of tensors (return dataclasses.astuple(...) or a dict)")
