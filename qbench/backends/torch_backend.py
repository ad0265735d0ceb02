"""PyTorch as a qbench backend: eager (or torch.compile'd) modules on the CPU or an NVIDIA GPU.

A torch backend runs a variant's torch form (`BuiltVariant.torch_module`, a factory; see
qbench/variants/torch_forms.py), not its ONNX file. Inputs are passed positionally in the
order of the variant's ONNX inputs, which is the order of the module's arguments at export.

What a timed call covers (`timed_calls`, qbench.validate.latency): the module's forward and, on CUDA, a
`torch.cuda.synchronize()`, no more, as a deployed server pays per inference. Its inputs are converted to tensors
on the device (dtype cast, host -> device copy) before the clock starts, its outputs are left as tensors, and
`torch.inference_mode()` (FP16/BF16 modules also `torch.autocast` of their dtype: it decides what the ops compute
in, so it is kept, but entered once per loop) wraps the whole loop. `run`, which scores, computes the same
forward under the same modes and returns the outputs as float32 numpy (integer outputs keep their dtype), flattened
in order from a tensor, a tuple/list, or a dict / Hugging Face ModelOutput; the tensors of its inputs are reused
while the same, unchanged numpy arrays are fed again. A served call (`served_call`: the cold start's first run, the
real server's batches) pays what a server receiving numpy pays per batch, the conversions both ways, but enters the
modes once for its thread.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from qbench.backends.base import RunOptions
from qbench.backends.gpu_monitor import GpuMonitor
from qbench.backends.torch_state import module_state
from qbench.backends.torch_trace import (
    compute_dtypes,
    lowered_count,
    mixed_precision_label,
    product_dtypes,
    quantized_products_label,
)
from qbench.environment import cpu_has_vnni, timed_threads
from qbench.errors import MissingExtraError, QbenchError
from qbench.modelinfo.signature import read_model_info
from qbench.results.schema import EMULATED, NATIVE, Fidelity
from qbench.sources.torch_outputs import flatten_outputs
from qbench.sources.torch_wrappers import eval_mode
from qbench.variants.base import TORCH, BuiltVariant
from qbench.variants.torch_forms import (
    FAKE_QUANT,
    TORCH_COMPILE,
    TORCH_DEVICES,
    TORCH_UNAVAILABLE,
    quantized_linear_layers,
)

if TYPE_CHECKING:  # pragma: no cover
    import torch

NO_TORCH_FORM = "it exists only as an ONNX model (no PyTorch form)"
_HALF_DTYPES = {"fp16": "float16", "bf16": "bfloat16"}  # the dtype an FP16/BF16 variant's ops must compute in
_TORCHAO_DTYPES = {"int8": "int8", "fp8": "float8_e4m3fn"}  # the dtype a torchao form's matrix products must read


def _import_torch() -> ModuleType:
    try:
        return importlib.import_module("torch")
    except ImportError:
        raise MissingExtraError("torch", "torch", hint="install torch==2.13.0 first, then qbench[torch]") from None


class TorchRunner:
    """One loaded module on one device; see the module docstring for what a run times."""

    def __init__(
        self,
        module: torch.nn.Module,
        device: str,
        input_names: list[str],
        description: dict[str, Any],
        *,
        compiled: bool,
        monitor: GpuMonitor | None = None,
        threads_to_restore: int | None = None,
        precision: str = "fp32",
        counted: str | None = None,
        fidelity: Fidelity | None = None,
    ) -> None:
        self._module: torch.nn.Module | None = module
        self._device = device
        self._input_names = input_names
        self._description = description
        self._float_dtype = _float_dtype(module)
        self._compiled = compiled
        self._monitor = monitor
        self._threads_to_restore = threads_to_restore
        self._precision = precision
        self._counted = counted  # the dtype the variant's ops must compute in, where they are counted (_computed_in)
        self._prepared_for: tuple[np.ndarray, ...] = ()
        self._prepared: list[torch.Tensor] = []
        self._last_inputs: list[torch.Tensor] = []  # the last batch run
        self._seen_signatures: set[tuple[Any, ...]] = set()
        self._compile_ms = 0.0
        # what the load knew; a run that computed nothing in the type adds to it
        self._fidelity = fidelity or Fidelity()

    def _live(self) -> torch.nn.Module:
        if self._module is None:
            raise RuntimeError("this runner was closed")
        return self._module

    def run(self, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        """One batch, its outputs as numpy (for scoring)."""
        inputs = self._inputs(feeds)
        with self._modes():
            return self._answer(inputs)

    @contextlib.contextmanager
    def served_call(self) -> Iterator[Callable[[Mapping[str, np.ndarray]], list[np.ndarray]]]:
        """What a server runs per batch of requests arriving as numpy: their conversion to tensors on the device, the
        forward and the outputs back to numpy, inside inference mode (and autocast) entered once for the serving
        thread, as a server's worker enters them; no reuse of a previous batch's tensors (every request is new)."""
        with self._modes():
            yield lambda feeds: self._answer([self._tensor(array) for array in self._arrays(feeds)])

    def _answer(self, inputs: list[torch.Tensor]) -> list[np.ndarray]:
        """The forward on `inputs`, its outputs as numpy, under the modes the caller entered."""
        return [_to_numpy(tensor) for tensor in flatten_outputs(self._forward(inputs, self._signature(inputs)))]

    @contextlib.contextmanager
    def timed_calls(self, batches: Sequence[Mapping[str, np.ndarray]]) -> Iterator[list[Callable[[], Any]]]:
        """One call per batch for the latency loops, running only what a deployed server runs per inference: the
        forward on inputs already tensors on the device (converted here, before any clock starts), its outputs left
        as tensors, inside inference mode (and autocast) entered once for the whole loop."""
        prepared = [[self._tensor(array) for array in self._arrays(feeds)] for feeds in batches]
        with self._modes():
            yield [functools.partial(self._forward, inputs, self._signature(inputs)) for inputs in prepared]

    def _signature(self, inputs: Sequence[torch.Tensor]) -> tuple[Any, ...] | None:
        """What torch.compile specialises on (None for an eager module: nothing to track)."""
        return tuple((tuple(t.shape), t.dtype) for t in inputs) if self._compiled else None

    def _forward(self, inputs: list[torch.Tensor], signature: tuple[Any, ...] | None) -> Any:
        """The module on `inputs` (on CUDA, until the GPU is done); the first call of each input shape of a compiled
        module adds to compile_ms."""
        started = time.perf_counter()
        outputs = self._live()(*inputs)
        if self._device == "cuda":
            import torch

            torch.cuda.synchronize()
        self._last_inputs = inputs  # what _computed_in reruns
        if signature is not None and signature not in self._seen_signatures:
            self._seen_signatures.add(signature)
            self._compile_ms += (time.perf_counter() - started) * 1e3
        return outputs

    @contextlib.contextmanager
    def _modes(self) -> Iterator[None]:
        """Inference mode, and the autocast of an FP16/BF16 module, as every forward of it runs."""
        import torch

        with torch.inference_mode(), self._autocast():
            yield

    def _autocast(self) -> contextlib.AbstractContextManager[Any]:
        """FP16/BF16 modules run under torch.autocast of their dtype, as mixed-precision inference does: a forward()
        that casts to float32 on its own (`mask.float()` in mean pooling) would otherwise feed float32 activations
        to half-precision weights and fail; autocast computes those matmuls in the module's dtype."""
        import torch

        if self._float_dtype not in (torch.float16, torch.bfloat16):
            return contextlib.nullcontext()
        return torch.autocast(device_type="cuda" if self._device == "cuda" else "cpu", dtype=self._float_dtype)

    def _arrays(self, feeds: Mapping[str, np.ndarray]) -> tuple[np.ndarray, ...]:
        """The feeds in argument order."""
        missing = [name for name in self._input_names if name not in feeds]
        if missing:
            raise QbenchError(f"torch backend: feeds lack model input(s) {', '.join(missing)}")
        return tuple(feeds[name] for name in self._input_names)

    def _inputs(self, feeds: Mapping[str, np.ndarray]) -> list[torch.Tensor]:
        """The feeds as tensors on the device, in argument order; reused while the same arrays come again."""
        arrays = self._arrays(feeds)
        if len(arrays) != len(self._prepared_for) or any(a is not b for a, b in zip(arrays, self._prepared_for)):
            self._prepared = [self._tensor(array) for array in arrays]
            self._prepared_for = arrays  # holding the arrays keeps their identity from being reused
        return self._prepared

    def _tensor(self, array: np.ndarray) -> torch.Tensor:
        """A float array takes the module's float dtype (float16/bfloat16 modules); integers stay integers. Copied or
        cast only where needed (a served call pays this per batch): a read-only or strided array (torch warns on
        read-only ones), another dtype, another device."""
        import torch

        if not (array.flags.c_contiguous and array.flags.writeable):
            array = np.array(array, order="C")
        tensor = torch.from_numpy(array)
        dtype = self._float_dtype if tensor.is_floating_point() else tensor.dtype
        if dtype == tensor.dtype and self._device == "cpu":
            return tensor
        return tensor.to(device=self._device, dtype=dtype)

    def describe(self) -> dict[str, Any]:
        """What runs; on CUDA also the GPU utilisation and memory sampled since load."""
        import torch

        self._live()
        description = {**self._description, "threads": torch.get_num_threads(), **self._computed_in()}
        if self._compiled:
            description["compile_ms"] = round(self._compile_ms, 3)  # first call of each input shape: compile + one run
        if self._monitor is not None:
            description.update(self._monitor.snapshot())
        return description

    def _computed_in(self) -> dict[str, Any]:
        """What the variant's ops computed in on the last batch run (qbench.backends.torch_trace): for FP16/BF16 every
        computing op by its float type, for a torchao INT8/FP8 form its matrix products by their input type.
        `lowered_ops`: how many ran in the variant's type (0: none did); `kernels` says so when not all did."""
        if self._counted is None or not self._last_inputs:
            return {}
        module = getattr(self._live(), "_orig_mod", self._live())  # torch.compile'd: its eager module, same dtypes
        kernels = str(self._description["kernels"])
        with self._modes():
            if self._precision in _HALF_DTYPES:
                ops = compute_dtypes(lambda: module(*self._last_inputs))
                label = mixed_precision_label(self._precision, self._counted, ops)
                kernels = kernels if label == self._precision else label + kernels.removeprefix(self._precision)
            else:
                ops = product_dtypes(lambda: module(*self._last_inputs))
                kernels += quantized_products_label(self._counted, ops)
        return {"lowered_ops": lowered_count(self._counted, ops), "kernels": kernels}

    def result_fields(self, description: Mapping[str, Any]) -> dict[str, Any]:
        """What the result records of the module that ran, in place of the variant's ONNX file (which it did not
        run): no model file, the module's own bytes and state digest (qbench.backends.torch_state), and whether its
        figures are native, from the same facts as the kernels label in `description` (this runner's describe())."""
        state = module_state(self._live())
        fidelity = self._fidelity
        if description.get("lowered_ops") == 0:
            fidelity = Fidelity(EMULATED, EMULATED, f"no op computed in {self._counted}: the figures are float32's")
        notes = (f"model_sha256 absent: {state.why_no_digest}",) if state.sha256 is None else ()
        return {"model_path": None, "model_bytes": state.bytes, "model_sha256": state.sha256, "fidelity": fidelity,
                "notes": notes}

    def close(self) -> None:
        """Drop the module, stop the GPU monitor, give back cached GPU memory and the thread count."""
        import torch

        if self._module is None:
            return
        self._module, self._prepared, self._prepared_for, self._last_inputs = None, [], (), []
        if self._monitor is not None:
            self._monitor.stop()
        if self._device == "cuda":
            torch.cuda.empty_cache()
        if self._threads_to_restore is not None:
            torch.set_num_threads(self._threads_to_restore)


class TorchBackend:
    """Runs a variant's torch form on `device`."""

    name: ClassVar[str]
    device: ClassVar[str]  # "cpu" | "cuda"
    form: ClassVar[str] = TORCH  # it runs the variant's torch module, not its ONNX file
    runtime_packages: ClassVar[tuple[str, ...]] = ("torch", "torchao")  # torchao's tensor subclasses run its kernels

    def check_available(self) -> None:
        _import_torch()

    def supports(self, variant: BuiltVariant) -> str | None:
        if variant.torch_module is None:
            return str(variant.params.get(TORCH_UNAVAILABLE) or NO_TORCH_FORM)
        devices = variant.params.get(TORCH_DEVICES)
        if devices is not None and self.device not in devices:
            return f"its torch form runs only on {', '.join(devices)}"
        return None

    def load(self, variant: BuiltVariant, options: RunOptions) -> TorchRunner:
        return self.timed_load(variant, options)()

    def timed_load(self, variant: BuiltVariant, options: RunOptions) -> Callable[[], TorchRunner]:
        """The load the cold start times: building the variant's module and putting it on the device. The module's
        argument order is read from its ONNX file before, untimed: a server knows it from its code, and reading the
        file (weights included) took as long as building the module (650 ms for a 92 MB MLP)."""
        _import_torch()
        reason = self.supports(variant)
        if reason:
            raise QbenchError(f"{self.name} cannot run variant {variant.name}: {reason}")
        input_names = list(read_model_info(variant.onnx_path).inputs)  # the module's argument order
        return functools.partial(self._load, variant, options, input_names)

    def _load(self, variant: BuiltVariant, options: RunOptions, input_names: list[str]) -> TorchRunner:
        torch = _import_torch()
        threads_to_restore = self._set_threads(torch, options)
        try:
            module = eval_mode(variant.torch_module().to(self.device))
            description = {
                "runtime": "torch",
                "version": torch.__version__,
                "device": self.device_description(torch),
                "dtype": str(_float_dtype(module)).removeprefix("torch."),
                "kernels": self.kernels(variant, module),
            }
        except BaseException:
            if threads_to_restore is not None:
                torch.set_num_threads(threads_to_restore)
            raise
        return TorchRunner(
            module, self.device, input_names, description,
            compiled=bool(variant.params.get(TORCH_COMPILE)), monitor=self.start_monitor(torch),
            threads_to_restore=threads_to_restore, precision=variant.precision,
            counted=_counted_dtype(variant, module), fidelity=self.fidelity(variant, module),
        )  # fmt: skip

    def _set_threads(self, torch: ModuleType, options: RunOptions) -> int:
        """Apply the recipe's thread count (unset: qbench.environment.default_threads; torch's own default counts
        the affinity mask's CPUs whatever the cgroup quota allows); returns the count to restore at close."""
        previous = torch.get_num_threads()
        torch.set_num_threads(timed_threads(options.threads))
        return previous

    def device_description(self, torch: ModuleType) -> str:
        return self.device

    def start_monitor(self, torch: ModuleType) -> GpuMonitor | None:
        return None

    def kernels(self, variant: BuiltVariant, module: torch.nn.Module) -> str:
        """What kind of arithmetic actually runs, so that a latency is read for what it is (`fidelity` says the
        same in the figures column)."""
        if _is_fake_quant(variant):
            return "fake-quant (accuracy only)"
        if variant.precision in ("int8", "fp8"):
            quantized, total = quantized_linear_layers(module)
            if quantized == 0:  # not torchao's: a builder's own simulation (Q/DQ in float)
                return f"{variant.precision} simulated in float by its builder (accuracy only)"
            how = "torchao dynamic" if variant.precision == "int8" else "torchao float8 e4m3"
            return f"{variant.precision} ({how}, {quantized} of {total} linear layers){self.caveat(variant.precision)}"
        return f"{variant.precision}{self.caveat(variant.precision)}"

    def fidelity(self, variant: BuiltVariant, module: torch.nn.Module) -> Fidelity:
        """Whether the figures of `variant`'s module are native, as `kernels` labels it: a builder's float
        simulation of quantization (fake-quant, Q/DQ in float) has neither native accuracy nor latency; a
        precision this device has no native kernels for computes in its type (accuracy native) at a speed that is
        not the format's (latency emulated)."""
        if _is_fake_quant(variant) or (variant.precision in ("int8", "fp8")
                                       and quantized_linear_layers(module)[0] == 0):
            return Fidelity(EMULATED, EMULATED, self.kernels(variant, module))
        caveat = self.caveat(variant.precision)
        return Fidelity(NATIVE, EMULATED, caveat.strip(" ;()")) if caveat else Fidelity()

    def caveat(self, precision: str) -> str:
        """Why `precision` runs without native kernels here ("" when it has them)."""
        return ""


class TorchCPU(TorchBackend):
    name = "torch-cpu"
    device = "cpu"

    def caveat(self, precision: str) -> str:
        """oneDNN has native fp16/bf16 matmuls only on CPUs with AVX512-FP16/BF16 or AMX; fast int8 needs VNNI."""
        if precision == "int8":
            return "" if cpu_has_vnni() else "; no fast int8 kernel on this CPU (no VNNI): accuracy only"
        torch = _import_torch()
        probes = {"fp16": "_is_mkldnn_fp16_supported", "bf16": "_is_mkldnn_bf16_supported"}
        probe = getattr(torch.ops.mkldnn, probes[precision], None) if precision in probes else None
        if probe is None or probe():
            return ""
        return f" (no native {precision} matmul on this CPU: accuracy only)"


class TorchCUDA(TorchBackend):
    name = "torch-cuda"
    device = "cuda"
    needs_gpu = True  # a job on this backend asks the cluster for a GPU

    def check_available(self) -> None:
        torch = _import_torch()
        if not torch.cuda.is_available():
            build = f"torch {torch.__version__} is a CPU build" if torch.version.cuda is None else "no GPU is visible"
            raise QbenchError(
                "torch-cuda needs an NVIDIA GPU and a CUDA build of torch; this machine has none "
                f"(torch.cuda.is_available() is False: {build})"
            )

    def timed_load(self, variant: BuiltVariant, options: RunOptions) -> Callable[[], TorchRunner]:
        self.check_available()
        return super().timed_load(variant, options)

    def device_description(self, torch: ModuleType) -> str:
        index = torch.cuda.current_device()
        major, minor = torch.cuda.get_device_capability(index)
        return f"cuda:{index} ({torch.cuda.get_device_name(index)}, compute capability {major}.{minor})"

    def start_monitor(self, torch: ModuleType) -> GpuMonitor:
        monitor = GpuMonitor(device=torch.cuda.current_device())
        monitor.start()
        return monitor


def _is_fake_quant(variant: BuiltVariant) -> bool:
    """Builders mark fake-quant torch modules with params[FAKE_QUANT] (or say "fake-quant" in a note)."""
    noted = any("fake-quant" in note.lower() or "fake quant" in note.lower() for note in variant.notes)
    return bool(variant.params.get(FAKE_QUANT)) or noted


def _counted_dtype(variant: BuiltVariant, module: torch.nn.Module) -> str | None:
    """The dtype whose ops `TorchRunner` counts: FP16/BF16's float type, a torchao INT8/FP8 form's quantized type;
    None for FP32 and for a builder's own simulated or fake-quant module (it computes in float by design)."""
    if variant.precision in _HALF_DTYPES:
        return _HALF_DTYPES[variant.precision]
    torchao = (variant.precision in _TORCHAO_DTYPES and not _is_fake_quant(variant)
               and quantized_linear_layers(module)[0])
    return _TORCHAO_DTYPES[variant.precision] if torchao else None


def _float_dtype(module: torch.nn.Module) -> torch.dtype:
    """The dtype float inputs must have: that of the module's first float parameter, else of its first float buffer
    (a module holding its weights as buffers is converted by .half() too), float32 if none."""
    import torch

    for tensor in (*module.parameters(), *module.buffers()):
        if tensor.is_floating_point():
            return tensor.dtype
    return torch.float32


def _to_numpy(tensor: torch.Tensor) -> np.ndarray:
    """Float outputs as float32 (numpy has no bfloat16), on the host; no call where the tensor already is that."""
    import torch

    if tensor.is_floating_point() and tensor.dtype != torch.float32:
        tensor = tensor.float()
    if tensor.requires_grad:
        tensor = tensor.detach()
    return (tensor if tensor.device.type == "cpu" else tensor.cpu()).numpy()
