"""Inference BatchNormalization folded into the Conv before it, as the engines that run a narrow-float graph do.

ONNX Runtime's `ConvBNFusion` (a basic-level rewrite, on every execution provider, at the default optimisation
level) and TensorRT fold a BatchNormalization that reads a Conv into that Conv's weights and bias: the engine then
computes one Conv whose output is rounded once. A narrow-float emulation that rounds the Conv's output, then the
BatchNorm's, rounds twice and differs from those engines by about as much as FP16 differs from FP32 (a two-conv CNN:
68.3 dB SQNR from a numpy reference of the folded FP16 Conv, which is 65.7 dB from FP32; BF16 47.8 dB, 49.9 dB). The
emulations fold first: the folded weight and bias are computed in float32 from the weights the graph holds, then
stored in the format (`narrow`).

A pair is folded when the BatchNormalization is in inference mode, its scale, bias, mean and variance and the
Conv's weight (and bias) are initializers, and the Conv's output is read by that BatchNormalization only (not a
graph output). The Conv gets new initializers (a weight shared with another node is left as it is) and writes the
BatchNormalization's output.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection

import numpy as np
import onnx
from onnx import helper, numpy_helper

from qbench.variants.onnx_utils import names_read, outer_scope_reads
from qbench.variants.reference import fresh_name, names_in


def _attribute(node: onnx.NodeProto, name: str, default):
    found = [helper.get_attribute_value(a) for a in node.attribute if a.name == name]
    return found[0] if found else default


def fold_conv_batch_norms(
    model: onnx.ModelProto,
    narrow: Callable[[np.ndarray], np.ndarray],
    eligible: Callable[[onnx.NodeProto], bool] = lambda node: True,
    keep: Collection[str] = (),
) -> int:
    """Fold, in place, each inference BatchNormalization into the Conv it reads (module docstring); `narrow` stores
    the folded weight and bias in the format (float32 in, float32 out); pairs where a node is named in `keep` or
    fails `eligible` stay as they are. Returns how many were folded."""
    graph = model.graph
    values = {t.name: t for t in graph.initializer}
    readers = Counter(name for node in graph.node for name in (*node.input, *outer_scope_reads(node)))
    outputs = {o.name for o in graph.output}
    producer = {node.output[0]: node for node in graph.node if node.op_type == "Conv"
                and node.domain in ("", "ai.onnx")}
    taken = names_in(graph)
    folded: set[int] = set()  # the positions of the BatchNormalization nodes removed
    released: set[str] = set()  # initializers the folded pairs read: dropped below when nothing else does
    for index, bn in enumerate(graph.node):
        is_norm = bn.op_type == "BatchNormalization" and bn.domain in ("", "ai.onnx")
        conv = producer.get(bn.input[0]) if is_norm else None
        if (conv is None or readers[bn.input[0]] != 1 or bn.input[0] in outputs or len(bn.output) > 1
                or _attribute(bn, "training_mode", 0) or {conv.name, bn.name} & set(keep)
                or not (eligible(conv) and eligible(bn))
                or not all(name in values for name in [*bn.input[1:5], *conv.input[1:]])):  # fmt: skip
            continue
        scale, shift, mean, var = (numpy_helper.to_array(values[name]).astype(np.float32) for name in bn.input[1:5])
        factor = scale / np.sqrt(var + np.float32(_attribute(bn, "epsilon", 1e-5)))
        weight = numpy_helper.to_array(values[conv.input[1]]).astype(np.float32)
        bias = numpy_helper.to_array(values[conv.input[2]]).astype(np.float32) if len(conv.input) > 2 else 0
        new_weight = weight * factor.reshape(-1, *[1] * (weight.ndim - 1))
        new_bias = (bias - mean) * factor + shift
        names = [fresh_name(f"{conv.input[1]}/bn_folded", taken), fresh_name(f"{bn.name or conv.name}/bias", taken)]
        for name, value in zip(names, (new_weight, new_bias), strict=True):
            graph.initializer.append(numpy_helper.from_array(narrow(value.astype(np.float32)), name))
        released.update([*bn.input[1:5], *conv.input[1:]])
        conv.input[:] = [conv.input[0], *names]
        conv.output[0] = bn.output[0]
        folded.add(index)
    if folded:
        kept = [node for index, node in enumerate(graph.node) if index not in folded]
        graph.ClearField("node")
        graph.node.extend(kept)
        unread = released - names_read(graph) - {i.name for i in graph.input}
        remaining = [t for t in graph.initializer if t.name not in unread]
        graph.ClearField("initializer")
        graph.initializer.extend(remaining)
    return len(folded)
