"""The settings a PyTorch module holds besides its tensors and code, for the export's cache key: each submodule's
public attributes of plain values (a LayerNorm's `eps`, an attention layer's `num_attention_heads`, a Hugging Face
model's `config`), and tensors held as plain attributes rather than registered ones. A `save_pretrained` folder whose
config.json changed (`layer_norm_eps`) with the same weights and the same installed classes was exported under the
old key, and the old export reused: its logits differed from forward()'s by 7.1 on the recipe's rows."""

from __future__ import annotations

import enum
import hashlib
import io
import logging
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    import torch

_DEPTH = 6  # nesting followed into a setting's own attributes (a config of sub-configs); deeper is left out
# where a module reports or reads, not what it computes: their state differs between processes (a logger's parent is
# the root logger, whose handlers and level follow what the process imported and configured; a file's position), so
# followed, they gave every process its own key and every sweep a new export
_PROCESS_STATE = (logging.Logger, logging.Handler, io.IOBase)


def settings_sha256(module: torch.nn.Module) -> str:
    """sha256 over every submodule's public non-module, non-parameter attributes (name and value, as `_plain` writes
    them); private ones (`_parameters`, hooks, torch's own caches) and callables are left out."""
    digest = hashlib.sha256()
    for name, submodule in module.named_modules():
        settings = {key: value for key, value in vars(submodule).items() if not key.startswith("_")}
        digest.update(f"{name}:{_plain(settings, _DEPTH)};".encode())
    return digest.hexdigest()


def _plain(value: Any, depth: int) -> str:
    """`value` written so that equal settings give equal text in any process: numbers, strings and containers of
    them; tensors and array-likes (numpy arrays and scalars, pandas frames) by dtype, shape and bytes; an object by its
    class and public attributes. Callables, submodules (each is keyed on its own), loggers and files
    (`_PROCESS_STATE`) and anything deeper than `depth` are written by their type alone."""
    import torch

    if value is None or isinstance(value, (bool, int, float, str, bytes, torch.dtype, torch.device, enum.Enum)):
        return repr(value)
    if isinstance(value, torch.Tensor):
        flat = value.detach().cpu().contiguous().reshape(-1)
        return f"tensor({flat.dtype},{tuple(value.shape)},{hashlib.sha256(flat.view(torch.uint8).numpy()).hexdigest()})"
    kind = type(value).__qualname__
    if depth == 0 or isinstance(value, (torch.nn.Module, *_PROCESS_STATE)) or callable(value):
        return kind
    if hasattr(type(value), "__array__"):
        # numpy arrays and scalars, pandas frames: their values (no public attributes)
        array = np.asarray(value)
        if array.dtype.kind == "O":  # objects: their bytes are addresses
            return f"{kind}({array.shape},{_plain(array.tolist(), depth - 1)})"
        digest = hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest()
        return f"{kind}({array.dtype},{array.shape},{digest})"
    if isinstance(value, dict):
        items = sorted((repr(key), _plain(item, depth - 1)) for key, item in value.items())
        return "{" + ",".join(f"{key}:{item}" for key, item in items) + "}"
    if isinstance(value, (list, tuple)):
        return f"{kind}[" + ",".join(_plain(item, depth - 1) for item in value) + "]"
    if isinstance(value, (set, frozenset)):
        return f"{kind}[" + ",".join(sorted(_plain(item, depth - 1) for item in value)) + "]"
    attributes = getattr(value, "__dict__", None)
    if not isinstance(attributes, dict):
        return kind
    public = {key: item for key, item in attributes.items() if not key.startswith("_")}
    return f"{kind}{_plain(public, depth - 1)}"
