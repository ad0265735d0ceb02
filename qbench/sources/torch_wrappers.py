"""Modules as teams hand them over: a factory may return its model inside a wrapper that computes what the model
computes but that the TorchScript exporter cannot trace (`torch.compile`'s OptimizedModule, `nn.DataParallel`),
a TorchScript module (`torch.jit.load`), or `torch.export.load(...).module()`, whose
`eval()` raises. The wrapped model is what qbench builds, weighs and exports; the others are taken as they are."""

from __future__ import annotations

import hashlib
import logging
import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    import torch

logger = logging.getLogger(__name__)

_GUARD = "Guard failed"  # a torch.export program's module() checking the sizes it was exported at


def guard_remedy(exc: Exception) -> str | None:
    """What to do where a `torch.export` program's module() refused a size it was not exported at (`Guard failed:
    x.size()[0] == 8`), the example's batch or another; None for any other failure."""
    if not str(exc).startswith(_GUARD):
        return None
    return ("a torch.export program holds the sizes it was exported at unless told otherwise: export it with a dynamic "
            "batch, torch.export.export(model, args, dynamic_shapes={'<argument>': {0: torch.export.Dim('batch')}})")


def unwrapped(module: torch.nn.Module) -> torch.nn.Module:
    """The model inside `module`'s wrappers (each computes its model's forward() unchanged), outermost first."""
    import torch

    while True:
        if isinstance(module, torch.nn.DataParallel):
            inner, wrapper = module.module, type(module).__name__
        elif isinstance(getattr(module, "_orig_mod", None), torch.nn.Module):  # torch.compile's OptimizedModule
            inner, wrapper = module._orig_mod, "torch.compile"
        else:
            return module
        logger.info("model.torch: the factory returned its model wrapped by %s; qbench exports and runs the model "
                    "inside (%s)", wrapper, type(inner).__name__)  # fmt: skip
        module = inner


def eval_mode(module: Any) -> Any:
    """`module.eval()`, where the module allows it: `torch.export.load(...).module()` raises NotImplementedError, its
    Dropout and BatchNorm held in the mode they were exported in (a training-mode export's random Dropout and per-batch
    BatchNorm are then refused by the reference checks, as any such graph is)."""
    try:
        return module.eval()
    except NotImplementedError:
        return module


def is_script_module(module: Any) -> bool:
    """Whether `module` is TorchScript (`torch.jit.script`/`trace`, `torch.jit.load`): its forward() is compiled and
    cannot be replaced on the instance; the exporter passes it the inputs by position as it is."""
    import torch

    return isinstance(module, torch.jit.ScriptModule)


_MANGLED = re.compile(r"\.___torch_mangle_\d+")  # TorchScript's per-process class renaming: not the model's code


def generated_code_sha256(module: torch.nn.Module) -> str:
    """sha256 of the code a module carries as data rather than in a source file: a TorchScript module's graph (every
    method and script function it calls, inlined) and a torch.fx GraphModule's generated forward (`torch.export`'s
    module). Weights alike, such code is part of the artefact: a `.pt` scripted anew from an edited forward() with the
    same weights was exported under the old key, and the old export was reused. A graph is written without its
    source ranges, which name the file's path: the same code scripted in another checkout's folder (a CI job's
    workspace) was keyed anew and exported again. "" where there is none."""
    import torch

    digest, found, scripted = hashlib.sha256(), False, []
    for name, submodule in module.named_modules():
        if any(name.startswith(f"{outer}.") or not outer for outer in scripted):
            continue  # inlined in its scripted parent's graph
        if isinstance(submodule, torch.jit.ScriptModule):
            code = _MANGLED.sub("", submodule.inlined_graph.str(False))  # no source ranges: the file's folder
            scripted.append(name)
        elif isinstance(submodule, torch.fx.GraphModule):
            code = submodule.code
        else:
            continue
        digest.update(f"{name}:{len(code)}:{code};".encode())
        found = True
    return digest.hexdigest() if found else ""
