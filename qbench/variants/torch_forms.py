"""The torch form of a variant: the recipe's PyTorch module, transformed for the variant's precision.

When a recipe has a PyTorch source, the sweep calls `attach_torch_form` after building each
variant; the torch-cpu / torch-cuda backends then run `built.torch_module()`, a factory that
builds a fresh module on every call:

    fp32          the module as it is
    fp16 / bf16   module.half() / module.to(torch.bfloat16)
    int8 dynamic  torchao `Int8DynamicActivationInt8WeightConfig`: int8 per-row weights, int8
                  activations quantized per token at run time, on every nn.Linear
    fp8           torchao `Float8DynamicActivationFloat8WeightConfig` (E4M3, dynamic scaling) on
                  nn.Linear layers, on CUDA GPUs of compute capability >= 8.9 only
    int8 static   none: it exists only as an ONNX Runtime (or ModelOpt) QDQ model

The form is recorded in `params` (TORCH_FORM, TORCH_DEVICES, TORCH_COMPILE), scoped to the torch form, and the
ONNX builder's params and notes are scoped to the ONNX form (`BuiltVariant.param_forms`/`note_forms`); a variant
without one records why in TORCH_UNAVAILABLE, which the torch backends give as their reason
to skip it. The recipe's ONNX quantization options (calibrator, per_channel, exclude_nodes...)
shape the ONNX form only: torchao picks its own scales, and the notes say so.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from types import ModuleType
from typing import TYPE_CHECKING, Any

from qbench.errors import QbenchError
from qbench.variants.base import ONNX, TORCH, BuiltVariant

if TYPE_CHECKING:  # pragma: no cover
    from torch import nn

    from qbench.recipe.spec import VariantSpec

# keys this module writes into BuiltVariant.params
TORCH_FORM = "torch.form"  # what the torch form is
TORCH_DEVICES = "torch.devices"  # the torch devices it can run on
TORCH_COMPILE = "torch.compile"  # whether the factory wraps the module with torch.compile
TORCH_UNAVAILABLE = "torch.unavailable"  # why there is no torch form
# set (True) by builders whose torch module simulates quantization with fake-quant ops (QAT):
# its accuracy is the point, its latency is not
FAKE_QUANT = "fake_quant"

FP8_MIN_CAPABILITY = (8, 9)  # Ada / Hopper: the first GPUs with float8 tensor cores
_TORCHAO_IMPORT_NOISE = ("torchao", "torch.utils._pytree")  # loggers that warn about optional kernels at import


@dataclass(frozen=True)
class TorchForm:
    """How to turn the FP32 module into this variant: a transform, where it runs, what to tell the user."""

    description: str
    transform: Callable[[nn.Module], nn.Module]
    devices: tuple[str, ...] = ("cpu", "cuda")
    note: str | None = None


@dataclass(frozen=True)
class TorchFormFactory:
    """Builds the variant's module afresh on each call (a backend owns the module it loads)."""

    torch_model: Any  # qbench.sources.torch_model.TorchModel, or anything with build() -> nn.Module
    form: TorchForm
    compile: bool = False

    def __call__(self) -> nn.Module:
        import torch

        module = self.form.transform(self.torch_model.build())  # build(): in eval mode
        return torch.compile(module) if self.compile else module


def attach_torch_form(built: BuiltVariant, spec: VariantSpec, torch_model: Any) -> BuiltVariant:
    """`built` with a torch module factory for its precision, or with the reason it has none."""
    form = torch_form_for(spec, torch_model)
    if isinstance(form, str):  # the reason is the torch backends' (their skip); the rest is the graph's, unless marked
        reason = {TORCH_UNAVAILABLE: form}
        return replace(built, params={**built.params, **reason},
                       param_forms={**_forms(built.params, reason), **built.param_forms},
                       note_forms={**_forms(built.notes, ()), **built.note_forms})  # fmt: skip
    torch_params = {TORCH_FORM: form.description, TORCH_DEVICES: list(form.devices), TORCH_COMPILE: spec.compile}
    notes = (*built.notes, form.note) if form.note and form.note not in built.notes else built.notes  # idempotent
    return replace(
        built, torch_module=TorchFormFactory(torch_model, form, spec.compile), params={**built.params, **torch_params},
        notes=notes, param_forms=_forms(built.params, torch_params), note_forms=_forms(built.notes, (form.note,)),
    )  # fmt: skip


def _forms(built: Iterable[str], torch_form: Iterable[str | None]) -> dict[str, str]:
    """What the ONNX builder wrote (params by key, notes) describes its graph only, not the torch form derived from
    the recipe's module; what this module adds describes the torch form only (a variant read back from the build
    store already has it: it stays the torch form's)."""
    torch_only = {item for item in torch_form if item is not None}
    return {item: TORCH if item in torch_only else ONNX for item in (*built, *torch_only)}


def torch_form_for(spec: VariantSpec, torch_model: Any) -> TorchForm | str:
    """The torch form of the variant `spec` describes, or why it has none."""
    if spec.qat is not None:
        return "the QAT builder gave this variant no torch module"
    if spec.precision == "fp32":
        return TorchForm("fp32: the module as it is", _as_is)
    if spec.precision == "fp16":
        return TorchForm("fp16: module.half()", _to_float16)
    if spec.precision == "bf16":
        return TorchForm("bf16: module.to(torch.bfloat16)", _to_bfloat16)
    if spec.precision == "int8" and spec.calibrator == "dynamic" and spec.quantizer != "modelopt":
        return _int8_dynamic_form(torch_model)
    if spec.precision == "fp8":
        return _fp8_form(torch_model)
    who = "ModelOpt" if spec.quantizer == "modelopt" else "ONNX Runtime"
    return f"exists only as an {who} QDQ model (static {spec.precision} has no torch form)"


def quantized_linear_layers(module: nn.Module) -> tuple[int, int]:
    """(quantized, total) nn.Linear layers; torchao swaps a quantized layer's weight for a tensor subclass."""
    import torch

    linears = [m for m in module.modules() if isinstance(m, torch.nn.Linear)]
    quantized = sum(type(m.weight) not in (torch.Tensor, torch.nn.Parameter) for m in linears)
    return quantized, len(linears)


# -- the transforms ------------------------------------------------------------------------------


def _as_is(module: nn.Module) -> nn.Module:
    return module


def _to_float16(module: nn.Module) -> nn.Module:
    return module.half()


def _to_bfloat16(module: nn.Module) -> nn.Module:
    import torch

    return module.to(torch.bfloat16)


def _int8_dynamic(module: nn.Module) -> nn.Module:
    torchao = import_torchao()
    torchao.quantize_(module, torchao.Int8DynamicActivationInt8WeightConfig())
    return _require_quantized(module, "torchao int8 dynamic")


def _float8_dynamic(module: nn.Module) -> nn.Module:
    """Moved to the GPU first: torchao checks the device and computes float8 scales there."""
    torchao = import_torchao()
    module = module.to("cuda")
    torchao.quantize_(module, torchao.Float8DynamicActivationFloat8WeightConfig())
    return _require_quantized(module, "torchao float8 (layers need in/out features divisible by 16)")


def _require_quantized(module: nn.Module, how: str) -> nn.Module:
    """An "int8" module that torchao left in FP32 would be measured under a false name: refuse it."""
    quantized, total = quantized_linear_layers(module)
    if quantized == 0:
        raise QbenchError(f"{how} quantized none of the model's {total} nn.Linear layers")
    return module


# -- forms that depend on the model or the machine -----------------------------------------------


def _int8_dynamic_form(torch_model: Any) -> TorchForm | str:
    missing = _torchao_missing() or _no_linear_layers(torch_model)
    if missing:
        return missing
    return TorchForm(
        "int8 dynamic: torchao Int8DynamicActivationInt8WeightConfig on nn.Linear layers",
        _int8_dynamic,
        note=(
            "torch form: torchao int8 (per-row weights, per-token dynamic activations, nn.Linear only); "
            "the recipe's ONNX quantization options do not apply to it"
        ),
    )


def _fp8_form(torch_model: Any) -> TorchForm | str:
    missing = _torchao_missing() or _no_fp8_gpu() or _no_linear_layers(torch_model)
    if missing:
        return missing
    return TorchForm(
        "fp8 e4m3: torchao Float8DynamicActivationFloat8WeightConfig on nn.Linear layers",
        _float8_dynamic,
        devices=("cuda",),
        note="torch form: torchao float8 E4M3 with dynamic per-tensor "
             "scales; the recipe's calibrator applies to the ONNX form only",
    )


def _no_linear_layers(torch_model: Any) -> str | None:
    import torch

    module = torch_model.build()
    if any(isinstance(m, torch.nn.Linear) for m in module.modules()):
        return None
    if isinstance(module, (torch.jit.ScriptModule, torch.fx.GraphModule)):  # its layers are compiled, not nn.Linear
        kind = "TorchScript" if isinstance(module, torch.jit.ScriptModule) else "torch.fx/torch.export"
        return (f"torchao quantizes nn.Linear layers, and a {kind} module holds none: give the model's class and "
                "state_dict for a torch INT8 form")
    return "torchao quantizes nn.Linear layers and this model has none"


def _no_fp8_gpu() -> str | None:
    """Why torchao float8 cannot run here, or None on a CUDA GPU of compute capability >= 8.9."""
    import torch

    needs = ("torchao float8 needs an NVIDIA GPU of compute capability "
             f">= {'.'.join(map(str, FP8_MIN_CAPABILITY))} (Ada, Hopper)")
    if not torch.cuda.is_available():
        return f"{needs}; this machine has none"
    capability = torch.cuda.get_device_capability()
    if capability < FP8_MIN_CAPABILITY:
        return f"{needs}; this GPU ({torch.cuda.get_device_name()}) is {capability[0]}.{capability[1]}"
    return None


def _torchao_missing() -> str | None:
    try:
        import_torchao()
    except QbenchError as exc:
        return str(exc)
    return None


@contextlib.contextmanager
def _quiet(logger_names: tuple[str, ...]) -> Iterator[None]:
    """Raise these loggers to ERROR for a while (torchao warns at import about kernels this machine lacks)."""
    loggers = [logging.getLogger(name) for name in logger_names]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def import_torchao() -> ModuleType:
    """torchao.quantization, imported without its warnings about optional CUDA kernels."""
    with _quiet(_TORCHAO_IMPORT_NOISE):
        try:
            return importlib.import_module("torchao.quantization")
        except ImportError as exc:
            raise QbenchError(f"torchao is not installed ({exc}): install it with `pip install torchao`") from None
