"""Which float dtype the ops of a torch forward really computed in.

An FP16/BF16 torch form is `module.half()` (or bfloat16) run under `torch.autocast`, so a forward() that casts to
float32 itself (`x.float()`, `w.float()`) runs those ops in float32: the variant is then mixed precision, and where
no op at all computed in the narrow type its figures are float32's under an FP16/BF16 name. The weights' dtype says
nothing about this; the ops do. `compute_dtypes` runs one forward under a dispatch mode, which sees each aten op
after autocast has cast its inputs, and counts the ops that compute (casts, copies, views and data movement
left out) by the dtype of their float output. An INT8/FP8 torchao form is read the same way: `product_dtypes` counts
its matrix products by the dtype they computed in, so a product torchao left in float is said, not hidden behind
"1 of 1 linear layers".
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

# aten ops that move, cast or create values without arithmetic on them
_NOT_COMPUTE = frozenset({
    "_to_copy", "to", "clone", "copy", "copy_", "contiguous", "detach", "lift_fresh", "lift_fresh_copy", "alias",
    "empty", "empty_like", "empty_strided", "zeros", "zeros_like", "ones", "ones_like", "full", "full_like",
    "fill", "fill_", "cat", "stack", "index", "index_select", "gather", "embedding", "slice", "select", "split",
    "split_with_sizes", "unbind", "flatten", "reshape", "_unsafe_view", "constant_pad_nd", "repeat", "where",
    "masked_fill", "scalar_tensor", "arange", "_local_scalar_dense",
})  # fmt: skip


# aten ops that multiply matrices: what a quantized layer runs with integer (or float8) kernels. A recurrent layer
# (nn.LSTM, nn.GRU, nn.RNN) runs its products inside one fused kernel where the backend has one (oneDNN's
# mkldnn_rnn_layer for an LSTM on CPU, cuDNN's on CUDA), otherwise as addmm/mm; torchao leaves it float either way.
# Attention does likewise: nn.MultiheadAttention in inference runs its projections and both attention products in
# one fused op (_native_multi_head_attention; an nn.TransformerEncoderLayer whose weights torchao left alone, the
# whole layer in _transformer_encoder_layer_fwd), and scaled_dot_product_attention in a flash/efficient kernel.
_PRODUCTS = frozenset({
    "mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "mv", "addmv", "dot", "einsum", "_int_mm",
    "_weight_int8pack_mm", "_scaled_mm", "convolution", "_convolution", "conv1d", "conv2d", "conv3d",
    "lstm", "gru", "rnn_tanh", "rnn_relu", "mkldnn_rnn_layer", "mkldnn_rnn", "_cudnn_rnn", "miopen_rnn",
    "_thnn_fused_lstm_cell", "_thnn_fused_gru_cell",
    "_native_multi_head_attention", "_transformer_encoder_layer_fwd", "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention", "_efficient_attention_forward", "_flash_attention_forward",
})  # fmt: skip


def compute_dtypes(run: Callable[[], Any]) -> dict[str, Counter[str]]:
    """The computing aten ops `run()` executed, per float output dtype ({"float16": {"linear": 3}, "float32": ...})."""

    def float_output(name: str, func: Any, args: Sequence[Any], out: Any) -> str | None:
        first = out[0] if isinstance(out, (tuple, list)) and out else out
        if name in _NOT_COMPUTE or func.is_view or not getattr(first, "is_floating_point", bool)():
            return None
        return str(first.dtype)

    return _count_ops(run, float_output)


def product_dtypes(run: Callable[[], Any]) -> dict[str, Counter[str]]:
    """The matrix products (matmul, linear, conv...) `run()` executed, per dtype of their first tensor input: int8 in
    the integer kernel of a layer torchao quantized, float32 in one left in float (torchao swaps nn.Linear weights
    only, so a forward's own `torch.matmul(x, w)` stays float). The dispatch mode sees the aten ops a quantized
    weight's tensor subclass runs, so these are the kernels that computed, not the layers' declared types."""

    def first_input(name: str, func: Any, args: Sequence[Any], out: Any) -> str | None:
        first = next((a for a in args if hasattr(a, "dtype") and hasattr(a, "shape")), None)
        return str(first.dtype) if name in _PRODUCTS and first is not None else None

    return _count_ops(run, first_input)


def _count_ops(
    run: Callable[[], Any], dtype_of: Callable[[str, Any, Sequence[Any], Any], str | None]
) -> dict[str, Counter[str]]:
    """The aten ops `run()` executed, by name, per the dtype `dtype_of(name, func, args, output)` gives (None: left
    out)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    ops: dict[str, Counter[str]] = {}

    class _Count(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Sequence[Any] = (), kwargs: Any = None) -> Any:
            out = func(*args, **(kwargs or {}))
            name = func.overloadpacket.__name__
            dtype = dtype_of(name, func, args, out)
            if dtype is not None:
                ops.setdefault(dtype.removeprefix("torch."), Counter())[name] += 1
            return out

    with _Count():
        run()
    return ops


# 8-bit integer products take their activations signed or unsigned, as the CPU's kernels prefer (torchao's dynamic
# INT8 feeds torch._int_mm uint8 activations on some x86 CPUs): both are the variant's INT8
_SAME_PRECISION = {"int8": frozenset({"int8", "uint8"})}


def computes_in(dtype: str, counted: str) -> bool:
    """Whether a product whose first input is `dtype` ran in the variant's `counted` type."""
    return dtype in _SAME_PRECISION.get(counted, frozenset({counted}))


def lowered_count(counted: str, ops: dict[str, Counter[str]]) -> int:
    """How many of `ops` (per dtype) ran in the variant's `counted` type."""
    return sum(sum(names.values()) for d, names in ops.items() if computes_in(d, counted))


def quantized_products_label(dtype: str, products: dict[str, Counter[str]]) -> str:
    """From `product_dtypes`, what of a quantized torch form's matrix products did not run in `dtype` ("" when all
    did): '; matrix products: 1 of 2 in int8, 1 left in float32 (matmul)'."""
    counts = {d: sum(names.values()) for d, names in products.items()}
    others = sorted(d for d in counts if not computes_in(d, dtype))
    if not others:
        return ""
    left = ", ".join(f"{counts[d]} left in {d} ({', '.join(sorted(products[d])[:5])})" for d in others)
    return f"; matrix products: {lowered_count(dtype, products)} of {sum(counts.values())} in {dtype}, {left}"


def mixed_precision_label(precision: str, dtype: str, ops: dict[str, Counter[str]]) -> str:
    """What an FP16/BF16 torch variant computed, from `compute_dtypes`: the precision alone when every computing op
    ran in `dtype`, else how many ran in another type and which; "no op computed in" when none ran in `dtype`."""
    counts = {d: sum(names.values()) for d, names in ops.items()}
    total = sum(counts.values())
    others = sorted(d for d in counts if d != dtype)
    if counts.get(dtype, 0) == 0:
        where = ", ".join(others) or "no float type"
        return (f"{precision} requested, but no op computed in {dtype} "
                f"({total} ops in {where}): the figures are not {precision}'s")
    if not others:
        return precision
    parts = [f"{counts[d]} of {total} ops in {d} ({', '.join(sorted(ops[d])[:5])})" for d in others]
    return f"{precision} mixed: {'; '.join(parts)}"
