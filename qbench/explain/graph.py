"""The ONNX graph side of `qbench explain`: which nodes a variant quantized, candidates that keep some
of them float, and the noise each node adds (SQNR from the intermediate tensors of both models).

A candidate of a static (QDQ) variant is the built graph with the Q/DQ on the chosen nodes' inputs
bypassed: the same calibration ranges, no rebuild (ORT's quantizer folds a Relu/Clip into the
preceding Q; a bypass restores it). A dynamic variant is rebuilt with `exclude_nodes`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

from qbench.backends import Backend
from qbench.backends.base import RunOptions
from qbench.data import iter_batches
from qbench.recipe.spec import VariantSpec
from qbench.variants import BuildContext, BuiltVariant, build_variant
from qbench.variants.float_support import tensor_types
from qbench.variants.onnx_utils import load_model, save_model
from qbench.variants.qdq_bypass import bypass_qdq, dequantized_from

SQNR_BATCH_ROWS = 4  # the intermediate tensors of every quantized node are held for this many rows at a time
Feeds = dict[str, np.ndarray]


# torch.onnx's dynamo exporter names nodes flat (`node_linear_14`) and records each one's module path here, a Python
# list from the root module down to the FX node: "['', 'm', 'm.layers.0', 'm.layers.0.fc1', 'linear_1']"
_NAME_SCOPES = "pkg.torch.onnx.name_scopes"


@dataclass(frozen=True)
class QuantizedNode:
    name: str
    op_type: str
    scope: str = ""  # the module the exporter recorded the node under (`m.layers.0.fc1`), where it recorded one

    @property
    def path(self) -> str:
        """What `explain --group layer | pattern` reads: the name, which the TorchScript exporter scopes
        (`/encoder/layer.3/output/dense/MatMul`), or `<module>/<op type>` where the exporter recorded the module
        apart from a flat name (`m.layers.0.fc1/MatMul`): a flat name says nothing about the layer."""
        return f"{self.scope}/{self.op_type}" if self.scope else self.name


def module_scope(node: onnx.NodeProto) -> str:
    """The innermost module `node` was exported from, as the exporter recorded it in the node's metadata
    (`_NAME_SCOPES`); '' where it recorded none, or nothing readable."""
    import ast

    recorded = next((p.value for p in node.metadata_props if p.key == _NAME_SCOPES), None)
    try:
        scopes = ast.literal_eval(recorded) if recorded else []
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return ""
    modules = [s for s in scopes[:-1] if isinstance(s, str) and s] if isinstance(scopes, list) else []
    return modules[-1] if modules else ""


# -- quantized nodes, and candidates that keep some of them float -----------------------------------------


def quantized_nodes(reference: onnx.ModelProto, built: BuiltVariant) -> list[QuantizedNode]:
    """Nodes of the variant's op types computing on quantized data: fed by a DequantizeLinear (static QDQ),
    or replaced by integer kernels (dynamic: their name is gone from the quantized graph)."""
    quantized = load_model(built.onnx_path)
    dynamic = built.dynamic
    dequantized = {o for n in quantized.graph.node if n.op_type == "DequantizeLinear" for o in n.output}
    present = {n.name: n for n in quantized.graph.node}

    def quantized_here(name: str) -> bool:
        own = present.get(name)
        return dynamic if own is None else any(i in dequantized for i in own.input)

    op_types = set(built.params.get("op_types", ()))
    if built.params.get("gemms_as_matmul"):
        op_types.add("Gemm")  # dynamic INT8 quantized them as MatMul, under their own names
    return [QuantizedNode(n.name, n.op_type, module_scope(n)) for n in reference.graph.node
            if n.op_type in op_types and n.name and quantized_here(n.name)]  # fmt: skip


class QdqBypass:
    """Candidates of a static QDQ variant: the built graph with the named nodes' input Q/DQ bypassed."""

    def __init__(self, built: BuiltVariant, reference: onnx.ModelProto, workdir: Path) -> None:
        self._built, self._reference, self.workdir = built, reference, workdir
        self._quantized = load_model(built.onnx_path)

    def keep_float(self, names: Collection[str], label: str) -> BuiltVariant:
        op_types = self._built.params.get("op_types")
        path = save_model(bypass_qdq(self._quantized, self._reference, names, op_types), self.workdir / f"{label}.onnx")
        return dataclasses.replace(self._built, name=label, onnx_path=path)


class Rebuild:
    """Candidates of a variant with no Q/DQ to bypass (dynamic INT8): rebuilt with `exclude_nodes`."""

    def __init__(self, spec: VariantSpec, ctx: BuildContext) -> None:
        self._spec, self._ctx = spec, ctx
        self.workdir = ctx.workdir  # where candidates are built: the only files a caller may delete

    def keep_float(self, names: Collection[str], label: str) -> BuiltVariant:
        excluded = list(dict.fromkeys([*self._spec.exclude_nodes, *sorted(names)]))
        return build_variant(self._spec.model_copy(update={"name": label, "exclude_nodes": excluded}), self._ctx)


def float_keeper(spec: VariantSpec, ctx: BuildContext, built: BuiltVariant) -> QdqBypass | Rebuild:
    """How candidates of `built` are made (into ctx.workdir): Q/DQ bypass if static, else a rebuild: dynamic builds
    have no Q/DQ to bypass, and smoothed ones (SmoothQuant) quantized weights that are no longer the FP32 ones."""
    if built.dynamic or built.params.get("weights_rewritten"):
        return Rebuild(spec, ctx)
    return QdqBypass(built, load_model(ctx.reference_path), ctx.workdir)


# -- SQNR: the noise each node adds ------------------------------------------------------------------------


def _tensor_pairs(name: str, reference: onnx.ModelProto, quantized: onnx.ModelProto) -> list[tuple[str, str]]:
    """(quantized-graph tensor, reference tensor) for a node's activation inputs, its output last.

    A static node's tensors are read where its consumers read them (after the Q/DQ); a dynamic
    node's integer kernels read and write the original tensor names."""
    own = next((n for n in quantized.graph.node if n.name == name), None)
    if own is None:
        original = next(n for n in reference.graph.node if n.name == name)
        weights = {t.name for t in reference.graph.initializer}
        out = next((o for o in original.output if o), "")  # a recurrent node may leave Y unnamed and give Y_h only
        return [(i, i) for i in original.input if i and i not in weights] + [(out, out)]
    producers = {o: n for n in quantized.graph.node for o in n.output}
    readers = {
        i: n for n in quantized.graph.node for i in n.input if n.op_type in ("QuantizeLinear", "DequantizeLinear")
    }
    sources = {tensor: dequantized_from(tensor, producers)[1] for tensor in own.input}
    pairs = [(tensor, source) for tensor, source in sources.items() if source is not None]
    out = own.output[0]
    q = readers.get(out)
    dq = readers.get(q.output[0]) if q is not None else None
    if dq is None:
        return pairs + [(out, out)]
    known = {o for n in reference.graph.node for o in n.output}
    return pairs + [(dq.output[0], out if out in known else dq.output[0])]


def sqnr_costs(
    reference_path: Path, built: BuiltVariant, nodes: Sequence[QuantizedNode], batches: Iterable[Feeds],
    backend: Backend, options: RunOptions, workdir: Path, fixed_batch: int | None = None,
) -> dict[str, float]:  # fmt: skip
    """Node name -> the noise it adds: the noise-to-signal ratio (vs FP32) of its output, as its consumers
    read it, minus the largest of its activation inputs', over `batches` (NaN when not measurable).

    Both models run side by side a few rows at a time (a model with a `fixed_batch`: that many, a last
    batch filled with repeats whose values are left out); only running sums are kept."""
    size = fixed_batch or SQNR_BATCH_ROWS
    reference, quantized = load_model(reference_path), load_model(built.onnx_path)
    pairs = {n.name: _tensor_pairs(n.name, reference, quantized) for n in nodes}
    q_types, r_types = _float_tensor_types(quantized), _float_tensor_types(reference)
    wanted = sorted({p for tensors in pairs.values() for p in tensors if p[0] in q_types and p[1] in r_types})
    signal, noise = dict.fromkeys(wanted, 0.0), dict.fromkeys(wanted, 0.0)
    run_reference = _Exposed(backend, options, built, reference, {r: r_types[r] for _, r in wanted},
                             workdir / "sqnr-fp32.onnx")  # fmt: skip
    try:
        exposed = {q: q_types[q] for q, _ in wanted}
        run_quantized = _Exposed(backend, options, built, quantized, exposed, workdir / "sqnr-int8.onnx")
        try:
            for feeds in batches:
                rows = len(next(iter(feeds.values())))
                for start, batch in zip(range(0, rows, size), iter_batches(feeds, size, whole=fixed_batch is not None)):
                    r_values, q_values = run_reference(batch), run_quantized(batch)
                    for q, r in wanted:
                        values = real_rows(r_values[r], size, rows - start).astype(np.float64)
                        signal[(q, r)] += float(np.sum(values * values))
                        noise[(q, r)] += float(np.sum((real_rows(q_values[q], size, rows - start) - values) ** 2))
        finally:
            run_quantized.close()
    finally:
        run_reference.close()
    nsr = {p: noise[p] / signal[p] if signal[p] > 0 else math.nan for p in wanted}
    costs = {}
    for name, tensors in pairs.items():
        out = nsr.get(tensors[-1], math.nan)
        before = max((nsr[p] for p in tensors[:-1] if math.isfinite(nsr.get(p, math.nan))), default=0.0)
        costs[name] = max(out - before, 0.0) if math.isfinite(out) else math.nan
    return costs


def real_rows(values: np.ndarray, fed: int, real: int) -> np.ndarray:
    """The first `real` rows of a tensor computed on a batch of `fed` rows, when it has one row per fed row
    (the rest repeat rows to fill a fixed batch); any other tensor as it is."""
    return values[:real] if real < fed and values.ndim and values.shape[0] == fed else values


FLOAT_TYPES = (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.DOUBLE)


def _float_tensor_types(model: onnx.ModelProto) -> dict[str, int]:
    """Floating-point tensor -> its element type, as ONNX shape inference completed by the operator schemas ONNX
    Runtime registers states it (graph inputs and node outputs; float_support.tensor_types: in a graph with fused
    com.microsoft operators ONNX's inference alone types nothing after the first of them).

    Only these have a noise-to-signal ratio: a class id (ArgMax), a mask or a shape has none, and exposing it as
    float makes ONNX Runtime refuse the model; a tensor whose type inference cannot state is left out too."""
    types = tensor_types(model)
    computed = [o for n in model.graph.node for o in n.output] + [i.name for i in model.graph.input]
    return {name: types[name] for name in computed if types.get(name) in FLOAT_TYPES}


class _Exposed:
    """A runner of `model` with the tensors of `types` (name -> element type) added as outputs; calling it returns
    those tensors (and the feeds)."""

    def __init__(self, backend: Backend, options: RunOptions, built: BuiltVariant, model: onnx.ModelProto,
                 types: Mapping[str, int], path: Path) -> None:  # fmt: skip
        exposed = onnx.ModelProto()
        exposed.CopyFrom(model)
        have = {o.name for o in exposed.graph.output} | {i.name for i in exposed.graph.input}
        added = [n for n in types if n not in have]
        exposed.graph.output.extend(helper.make_tensor_value_info(n, types[n], None) for n in added)
        self._order = [o.name for o in exposed.graph.output]
        self._path = save_model(exposed, path)
        self._runner = backend.load(dataclasses.replace(built, onnx_path=path), options)

    def __call__(self, feeds: Feeds) -> dict[str, np.ndarray]:
        return dict(feeds) | dict(zip(self._order, self._runner.run(feeds)))

    def close(self) -> None:
        self._runner.close()
        self._path.unlink(missing_ok=True)
