"""What a torch result records as its model: the module's own bytes and a digest of its state.

A torch backend runs a module, not the variant's ONNX file, so the file's size and sha256 say nothing of what ran
(the BF16 variant's file is an FP32 graph twice the size of `module.to(torch.bfloat16)`; the bound estimate
multiplies the size by the runs per second). The size here is every parameter and buffer in the dtype it is held
in; a tensor subclass (torchao's quantized weights) counts the plain tensors it is made of (int8 data, scales),
not its nominal float shape. The digest covers each tensor's name, dtype, shape and bytes, so two modules with equal
digests hold the same state; the code that computes with it is the recipe's source, digested with the inputs.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    import torch


@dataclass(frozen=True)
class ModuleState:
    bytes: int
    sha256: str | None  # None when some tensor's values cannot be read here (`why_no_digest` says which)
    why_no_digest: str = ""


def module_state(module: torch.nn.Module) -> ModuleState:
    """The bytes and digest of `module`'s parameters and buffers (a torch.compile'd module: its eager module's)."""
    import torch

    module = getattr(module, "_orig_mod", module)
    size, digest, unreadable = 0, hashlib.sha256(), []
    seen: set[tuple[object, ...]] = set()  # a tensor shared by two names (tied weights) is held once
    named = [*module.named_parameters(remove_duplicate=False), *module.named_buffers(remove_duplicate=False)]
    for name, tensor in named:
        for part, plain in _plain_tensors(name, tensor):
            digest.update(f"{part}:{plain.dtype}:{tuple(plain.shape)}".encode())
            if plain.device.type == "meta":
                unreadable.append(part)
                size += plain.numel() * plain.element_size()
                continue
            held = (plain.untyped_storage().data_ptr(), plain.storage_offset(), plain.dtype, tuple(plain.shape))
            if held not in seen:
                seen.add(held)
                size += plain.numel() * plain.element_size()
            digest.update(plain.detach().contiguous().cpu().view(-1).view(torch.uint8).numpy().tobytes())
    if unreadable:
        return ModuleState(size, None, f"no sha256: {len(unreadable)} tensor(s) hold no values here ({unreadable[0]})")
    return ModuleState(size, digest.hexdigest())


def _plain_tensors(name: str, tensor: torch.Tensor) -> Iterator[tuple[str, torch.Tensor]]:
    """The plain tensors `tensor` is made of: itself, or a subclass's inner tensors (torch's
    `__tensor_flatten__` protocol, which torchao's quantized tensors follow), recursively."""
    import torch

    data = tensor.data if isinstance(tensor, torch.nn.Parameter) else tensor
    if type(data) is torch.Tensor or not hasattr(data, "__tensor_flatten__"):
        yield name, data
        return
    inner, _ = data.__tensor_flatten__()
    for attribute in inner:
        yield from _plain_tensors(f"{name}.{attribute}", getattr(data, attribute))

