"""What a PyTorch module's forward() returns, read the way the export writes it: one flat list of tensors (the
exported outputs, in order) and the names forward() itself gives them (a dict's keys, a namedtuple's fields)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from qbench.errors import QbenchError

if TYPE_CHECKING:  # pragma: no cover
    import torch


def own_names(outputs: Any, count: int) -> tuple[str, ...] | None:
    """The names forward() gives its tensors, in order, when it names them (a dict's keys, a namedtuple's fields;
    a Hugging Face ModelOutput is a dict): a tensor nested in a named item is named by its path
    (`hidden_states.0`). None when forward() returns no names, or they do not name each tensor once."""
    if not (isinstance(outputs, Mapping) or _fields(outputs)):
        return None
    names = _paths(outputs, "")
    return tuple(names) if len(names) == count and len(set(names)) == count else None


def _fields(value: Any) -> tuple[str, ...] | None:
    fields = getattr(value, "_fields", None)
    return tuple(str(field) for field in fields) if isinstance(value, tuple) and fields is not None else None


def _paths(value: Any, at: str) -> list[str]:
    """The name of each tensor in `value`, in flatten_outputs' order: its keys, fields and positions joined by '.'."""
    import torch  # only called on what a module returned: torch is loaded

    if isinstance(value, torch.Tensor):
        return [at]
    if isinstance(value, Mapping):
        parts: Any = ((str(key), item) for key, item in value.items())
    elif isinstance(value, (list, tuple)):
        parts = zip(_fields(value) or (str(index) for index in range(len(value))), value, strict=False)
    else:
        return []
    return [name for part, item in parts for name in _paths(item, f"{at}.{part}" if at else part)]


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
