"""Which float dtype the ops of a torch forward really computed in.

An FP16/BF16 torch form is `module.half()` (or bfloat16) run under `torch.autocast`, so a forward() that casts to
float32 itself (`x.float()`, `w.float()`) runs those ops in float32: the variant is then mixed precision, and where
no op at all computed in the narrow type its figures are float32's under an FP16/BF16 name. The weights' dtype says
nothing about this; the ops do. `compute_dtypes` runs one forward under a dispatch mode, which sees each aten op
after autocast has cast its inputs, and counts the ops that compute (casts, copies, views and data movement
left out) by the dtype of their float output.
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


def compute_dtypes(run: Callable[[], Any]) -> dict[str, Counter[str]]:
    """The computing aten ops `run()` executed, per float output dtype ({"float16": {"linear": 3}, "float32": ...})."""
    from torch.utils._python_dispatch import TorchDispatchMode

    ops: dict[str, Counter[str]] = {}

    class _Count(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Sequence[Any] = (), kwargs: Any = None) -> Any:
            out = func(*args, **(kwargs or {}))
            name = func.overloadpacket.__name__
            first = out[0] if isinstance(out, (tuple, list)) and out else out
            if name not in _NOT_COMPUTE and not func.is_view and getattr(first, "is_floating_point", bool)():
                ops.setdefault(str(first.dtype).removeprefix("torch."), Counter())[name] += 1
            return out

    with _Count():
        run()
    return ops


def mixed_precision_label(precision: str, dtype: str, ops: dict[str, Counter[str]]) -> str:
    """What an FP16/BF16 torch variant computed, from `compute_dtypes`: the precision alone when every computing op
    ran in `dtype`, else how many ran in another type and which; "no op computed in" when none ran in `dtype`."""
    counts = {d: sum(names.values()) for d, names in ops.items()}
    total = sum(counts.values())
    others = sorted(d for d in counts if d != dtype)
    if counts.get(dtype, 0) == 0:
        where = ", ".join(others) or "no float type"
        return f"{precision} requested, but no op computed in {dtype} ({total} ops in {where}): the figures are not {precision}'s"
    if not others:
        return precision
    parts = [f"{counts[d]} of {total} ops in {d} ({', '.join(sorted(ops[d])[:5])})" for d in others]
    return f"{precision} mixed: {'; '.join(parts)}"
