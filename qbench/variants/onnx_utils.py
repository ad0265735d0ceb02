"""Graph helpers shared by the variant builders: load/save, scratch folders, failures (opset upgrades: opset_upgrade).

ORT's quantization tools write intermediate models (shape-inferred copies,
augmented calibration graphs) next to their input and, when shape inference
fails, into the working directory (trials pitfall 9: 90 MB left behind). Every
builder therefore works on copies inside a `scratch_dir()`, which is also the
working directory while it is open, and writes only its final model (and
calibration cache) into the variant's workdir.
"""

from __future__ import annotations

import contextlib
import hashlib
import heapq
import io
import os
import re
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import onnx
import onnx.numpy_helper
from onnx import TensorProto, helper

from qbench.errors import QbenchError, one_line
from qbench.files import new_folder, writing_file
from qbench.onnx_read import all_graphs, copy_field, over_protobuf_limit, read_onnx, subgraphs_of, typing_skeleton
from qbench.variants.base import BuildContext, BuiltVariant

# metadata_props keys under which a saved variant declares the ONNX Runtime session options it needs
SESSION_METADATA_PREFIX = "onnxruntime.session_options."
# Integer kernels that ORT's dynamic (IntegerOps) quantizer substitutes for float ops.
INTEGER_KERNELS = frozenset({"MatMulInteger", "ConvInteger", "DynamicQuantizeMatMul", "QAttention",
                             "DynamicQuantizeLSTM"})  # fmt: skip


@contextlib.contextmanager
def build_step(variant: str, what: str) -> Iterator[None]:
    """Turn an ORT/onnx failure inside the block into a QbenchError naming the variant and the step.

    The sweep records a QbenchError as a failed variant and carries on; the original
    exception stays chained for debugging. The whole message is kept, on one line: the onnx checker's first line
    ends before the node it names.
    """
    try:
        yield
    except QbenchError:
        raise
    except Exception as exc:  # noqa: BLE001 (ORT and onnx raise many unrelated types)
        message = str(exc).strip() or type(exc).__name__
        raise QbenchError(one_line(f"variant {variant!r}: {what}: {message}")) from exc


@contextlib.contextmanager
def scratch_dir(prefix: str = "qbench-") -> Iterator[Path]:
    """A temporary folder that is also the working directory while open; removed afterwards.

    Callers must hold absolute paths: relative ones would resolve inside the scratch folder.
    """
    previous = Path.cwd()
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        os.chdir(tmp)
        try:
            yield Path(tmp)
        finally:
            os.chdir(previous)


@contextlib.contextmanager
def quiet_stdout() -> Iterator[None]:
    """Swallow the progress prints of ORT's calibrators, which would mix into qbench's stdout."""
    with contextlib.redirect_stdout(io.StringIO()):
        yield


def output_path(variant: str, ctx: BuildContext) -> Path:
    """`<workdir>/<variant>.onnx` as an absolute path, creating the workdir."""
    workdir = ctx.workdir.resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    return workdir / f"{variant}.onnx"


MEMORY_BUDGET_BYTES = 512 * 2**20  # a run with every intermediate tensor exposed holds them all at once


def rows_per_batch(bytes_per_row: int, batch_size: int, memory_budget: int) -> int:
    """The most rows (1 to `batch_size`) whose exposed tensors fit in `memory_budget` bytes."""
    return max(1, min(batch_size, memory_budget // max(bytes_per_row, 1)))


def load_model(path: Path) -> onnx.ModelProto:
    """The model with its local functions inlined (`qbench.onnx_read`) and any external data loaded into memory,
    every node of its main graph named.

    Builders exclude and keep nodes by name, and explain/fallback match a variant's nodes to the reference's by
    name; converters and hand-built graphs often leave names empty. The names given are a function of the graph
    alone, so every load of the same file names its nodes alike.
    """
    model = read_onnx(path, weights=True)
    name_unnamed_nodes(model)
    return model


def name_unnamed_nodes(model: onnx.ModelProto) -> None:
    """Give every unnamed node of the main graph a unique name (in place): block lists work by name."""
    taken = {node.name for node in model.graph.node if node.name}
    for index, node in enumerate(model.graph.node):
        if not node.name:
            candidate, n = f"{node.op_type}_{index}", 0
            while candidate in taken:
                n += 1
                candidate = f"{node.op_type}_{index}_{n}"
            node.name = candidate
            taken.add(candidate)


def save_model(model: onnx.ModelProto, path: Path) -> Path:
    """Save next to nothing else: weights go to `<name>.data` only when the model is too big for one file.

    The files are written in a staging folder beside `path` and renamed into place (the weights first, the model
    that names them last): a full disk or a crash mid-write leaves the earlier model or none, never a truncated one
    that a later reader (a resumed sweep, the gate's digest check) takes for whole. A failed write is a QbenchError
    naming `path` and the system's reason, raised from the OSError (a full disk stays a cause outside the variant).
    A model in one file is written piece by piece (`write_serialised`), never serialised whole in memory.
    """
    external = over_protobuf_limit(model)
    location = f"{path.name}.data"
    with writing_file(path, "the model"):
        path.parent.mkdir(parents=True, exist_ok=True)
        staging = new_folder(path.parent, path.name, "saving")
        try:
            if external:
                onnx.save_model(model, str(staging / path.name), save_as_external_data=True, location=location)
            else:
                with open(staging / path.name, "wb") as file:
                    write_serialised(model, file)
            if (staging / location).exists():  # onnx keeps tensors under 1 KiB in the model file
                os.replace(staging / location, path.parent / location)
            os.replace(staging / path.name, path)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return path


def write_serialised(model: onnx.ModelProto, file: BinaryIO) -> None:
    """Write `model.SerializeToString()` to `file`, the same bytes, a node or a tensor at a time: protobuf
    serialises a message whole into a growing buffer and copies it out (about three times the weights at once for
    `onnx.save_model`). A message's encoding is its set fields' in field-number order, each repeated item on its
    own, so the graph is written as its tag and length, then each field (each node, each initializer) alone.
    Fields this protobuf does not know (a model from a newer onnx) are no set field: where the pieces do not add up
    to the model's own size, the file is written again from SerializeToString, so nothing is lost."""
    start, written = file.tell(), 0
    for field, value in model.ListFields():
        if field.name != "graph":
            written += file.write(_field_bytes(onnx.ModelProto(), field, value))
            continue
        size = sum(len(piece) for piece in _graph_pieces(value))
        written += file.write(_varint(field.number << 3 | 2) + _varint(size))  # wire type 2: length-delimited
        for piece in _graph_pieces(value):
            written += file.write(piece)
    if written != model.ByteSize():
        file.seek(start)
        file.truncate()
        file.write(model.SerializeToString())


def _graph_pieces(graph: onnx.GraphProto) -> Iterator[bytes]:
    """The encoding of `graph`, field by field and its repeated messages item by item."""
    for field, value in graph.ListFields():
        if field.is_repeated and field.message_type is not None:
            for item in value:
                shell = onnx.GraphProto()
                getattr(shell, field.name).add().CopyFrom(item)
                yield shell.SerializeToString()
        else:
            yield _field_bytes(onnx.GraphProto(), field, value)


def _field_bytes(shell: Any, field: Any, value: Any) -> bytes:
    """The encoding of one field of a message: `shell`, an empty message of that type, with only that field set."""
    copy_field(shell, field, value)
    return shell.SerializeToString()


def _varint(number: int) -> bytes:
    out = bytearray()
    while number > 0x7F:
        out.append(number & 0x7F | 0x80)
        number >>= 7
    out.append(number)
    return bytes(out)


def default_opset(model: onnx.ModelProto) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)


def check_model_against(model: onnx.ModelProto | Path, source: onnx.ModelProto | Path) -> None:
    """Run the onnx checker on `model` (a model or its path: external data and files over 2 GiB are handled), which
    was made from `source`; raise its error unless `source` fails the checker with the same one. A model ONNX Runtime
    runs may not pass the checker (a graph input of unknown rank, which the checker wants a shape for): a build
    keeps that defect, which is the model's own, not the build's (an operator ONNX has no schema for, as ONNX Runtime's
    SimplifiedLayerNormalization in the ONNX domain, is the same defect at the opset a build raised the model to).
    The checker stops at its first error, so such a
    defect can hide one the build added; ONNX Runtime still refuses, when the variant is loaded, a graph it cannot
    run (the variant fails, never measured).
    A model in memory is checked as its typing skeleton (qbench.onnx_read): the checker serialises what it is given,
    a second and third copy of the weights at once (and fails over 2 GiB); its graph, nodes and types are what a
    build changes, and every saved variant is checked whole, by path, when it is settled."""
    try:
        onnx.checker.check_model(typing_skeleton(model) if isinstance(model, onnx.ModelProto) else str(model))
    except Exception as exc:  # noqa: BLE001 - the checker raises ValidationError, protobuf and IO errors
        try:
            onnx.checker.check_model(typing_skeleton(source) if isinstance(source, onnx.ModelProto) else str(source))
        except Exception as source_exc:  # noqa: BLE001 - as above
            if _opset_aside(str(source_exc)) == _opset_aside(str(exc)):
                return
        raise


def _opset_aside(error: str) -> str:
    """A checker error with the opset it names left out ('No Op registered for X with domain_version of 21')."""
    return re.sub(r"domain_version of \d+", "domain_version of N", error)


def quantized_op_counts(model: onnx.ModelProto, op_types: Collection[str]) -> dict[str, int]:
    """Op type -> nodes of `op_types` that run on quantized data (fed by a DequantizeLinear), plus integer kernels.

    Restricting to `op_types` keeps out float ops that merely read a dequantized tensor
    (a Relu after a quantized MatMul whose output ORT also quantized).
    """
    dequantized = {out for node in model.graph.node if node.op_type == "DequantizeLinear" for out in node.output}
    counts: Counter[str] = Counter()
    for node in model.graph.node:
        fed_dequantized = node.op_type in op_types and any(name in dequantized for name in node.input)
        if fed_dequantized or node.op_type in INTEGER_KERNELS:
            counts[node.op_type] += 1
    return dict(sorted(counts.items()))


def quantized_tensors(model: onnx.ModelProto) -> list[str]:
    """Float tensors that a QuantizeLinear node reads in the model's main graph, in graph order."""
    return list(dict.fromkeys(node.input[0] for node in model.graph.node if node.op_type == "QuantizeLinear"))


def custom_domains(model: onnx.ModelProto) -> set[str]:
    """Operator domains other than the standard ONNX one used by the model's nodes."""
    return {node.domain for node in model.graph.node if node.domain not in ("", "ai.onnx")}


class Stopwatch:
    """Seconds since creation: the build time every BuiltVariant records."""

    def __init__(self) -> None:
        self._start = time.perf_counter()

    def seconds(self) -> float:
        return time.perf_counter() - self._start


def names_read(graph: onnx.GraphProto) -> set[str]:
    """Every tensor name a node reads, in this graph and its subgraphs (which may read outer names)."""
    names: set[str] = set()
    for held in all_graphs(graph):
        names.update(output.name for output in held.output)
        for node in held.node:
            names.update(node.input)
    return names


def all_nodes(graph: onnx.GraphProto) -> Iterator[onnx.NodeProto]:
    """Every node of `graph` and of its subgraphs, at any depth (each node before those of its own subgraphs)."""
    for node in graph.node:
        yield node
        for body in subgraphs_of(node):
            yield from all_nodes(body)


def outer_scope_reads(node: onnx.NodeProto) -> list[str]:
    """Tensors of the enclosing graph that the node's subgraphs read by name (not through the node's inputs), each once.

    A torch-scripted `if` or loop reads activations and weights this way; graph tools that look only at
    `node.input` would take those producers for dead code, or convert a tensor a subgraph still reads as float32.
    """
    found: dict[str, None] = {}
    for body in subgraphs_of(node):
        defined = {i.name for i in body.input} | {t.name for t in body.initializer}
        defined |= {o for n in body.node for o in n.output}
        reads = [name for n in body.node for name in (*n.input, *outer_scope_reads(n))]
        found.update(dict.fromkeys(n for n in [*reads, *(o.name for o in body.output)] if n and n not in defined))
    return list(found)


def topologically_sorted(nodes: list[onnx.NodeProto]) -> list[onnx.NodeProto]:
    """`nodes` ordered so each reads only graph inputs, initializers or earlier outputs (converters may not sort).

    What a node's subgraphs read from this graph counts as read by the node. Among the nodes ready at each step the
    earliest in `nodes` goes first, so a sorted list comes back in its own order.
    """
    producer = {name: index for index, node in enumerate(nodes) for name in node.output if name}
    waiting = [{producer[name] for name in (*node.input, *outer_scope_reads(node)) if name in producer}
               for node in nodes]
    readers: dict[int, list[int]] = {}
    for index, needs in enumerate(waiting):
        for need in needs:
            readers.setdefault(need, []).append(index)
    ready = [index for index, needs in enumerate(waiting) if not needs]
    ordered: list[onnx.NodeProto] = []
    while ready:
        index = heapq.heappop(ready)
        ordered.append(nodes[index])
        for reader in readers.get(index, []):
            waiting[reader].discard(index)
            if not waiting[reader]:
                heapq.heappush(ready, reader)
    if len(ordered) != len(nodes):
        raise QbenchError("the graph has a cycle: its nodes cannot be ordered")
    return ordered


def sort_nodes(graph: onnx.GraphProto) -> bool:
    """Order `graph`'s nodes, and those of every graph nested in it, topologically (in place); whether any moved.

    A graph already in order is left as it is.
    """
    moved = False
    for node in graph.node:
        for body in subgraphs_of(node):
            moved = sort_nodes(body) or moved
    producer = {name: index for index, node in enumerate(graph.node) for name in node.output if name}
    if all(producer.get(name, -1) < index for index, node in enumerate(graph.node)
           for name in (*node.input, *outer_scope_reads(node))):  # fmt: skip
        return moved
    ordered = topologically_sorted(list(graph.node))
    graph.ClearField("node")
    graph.node.extend(ordered)
    return True


def rename_reads(graph: onnx.GraphProto, renamed: dict[str, str]) -> None:
    """Let `graph` and the graphs nested in it read the new names, outputs included (ONNX never redefines an outer
    name inside a subgraph, so every read of a name is a read of the same value)."""
    for node in graph.node:
        node.input[:] = [renamed.get(name, name) for name in node.input]
        for body in subgraphs_of(node):
            rename_reads(body, renamed)
    for output in graph.output:
        output.name = renamed.get(output.name, output.name)


def drop_unused_initializers(graph: onnx.GraphProto) -> None:
    """Remove initializers no node, subgraph or graph output reads (left behind by graph rewrites)."""
    read = names_read(graph) | {i.name for i in graph.input}
    kept = [t for t in graph.initializer if t.name in read]
    graph.ClearField("initializer")
    graph.initializer.extend(kept)


def declare_session_options(path: Path, options: dict[str, Any]) -> None:
    """Write `options` into the saved model's metadata_props, so a user loading the file knows what it needs.

    Default ONNX Runtime options must reproduce qbench's figures; where a variant cannot
    (e.g. graph_optimization_level basic for a Q/DQ pattern ORT mis-optimises), this is
    where the file says so.
    """
    model = onnx.load(str(path), load_external_data=False)
    kept = [p for p in model.metadata_props if not p.key.startswith(SESSION_METADATA_PREFIX)]
    model.ClearField("metadata_props")
    model.metadata_props.extend(kept)
    for key, value in sorted(options.items()):
        model.metadata_props.add(key=f"{SESSION_METADATA_PREFIX}{key}", value=str(value))
    onnx.save_model(model, str(path))


def unchanged_variant(
    variant: str, precision: str, ctx: BuildContext, why: str, params: dict[str, Any], seconds: float
) -> BuiltVariant:
    """A variant with nothing to change: the FP32 model itself, saying why (the sweep then reuses FP32's figures)."""
    return BuiltVariant(
        name=variant,
        precision=precision,
        onnx_path=ctx.reference_path.resolve(),
        params={**params, "unchanged": why},
        build_seconds=seconds,
        notes=(f"{why}: the variant is the FP32 model",),
        borrowed=True,
    )


def discard_built(built: BuiltVariant, owner: Path, *, with_folder: bool = False) -> None:
    """Delete a candidate's model file (`with_folder`: the folder holding it, when that lies below `owner`), only when
    it is a file of `owner`, the caller's own work folder (BuiltVariant.owned_by). A candidate that reuses the user's
    FP32 model (a rebuild with every node kept float comes back as that model) is left as it is."""
    if not built.owned_by(owner):
        return
    path = built.onnx_path.resolve()
    if with_folder and path.parent != owner.resolve():
        shutil.rmtree(path.parent, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def graph_digest(path: Path) -> str:
    """A digest of what a model computes: nodes (op, domain, tensors, attributes), initializers, I/O, opsets.

    Names of nodes, doc strings, value_info and metadata are left out, so two files that
    compute the same graph get the same digest (the sweep then measures it once). Remembered while the model file
    and its external-data files keep their identity, size and modification time and were last written well before
    (qbench.digests.file_key): the INT8 search and the sweep's plan each digest the FP32 model, which parses it whole.
    """
    return _digests(path)[0]


def kernels_digest(path: Path) -> str:
    """`graph_digest` without the values of initializers other than int64 ones (shapes, axes, indices), each kept
    only as whether it is all zeros (a zero point of 0 may take another kernel path): two models with the same one
    differ at most in their weights, scales and zero points, as a quantized model and its reduce_range twin do."""
    return _digests(path)[1]


def _digests(path: Path) -> tuple[str, str]:
    """`graph_digest` and `kernels_digest` of `path`, from one parse, remembered as `graph_digest` says."""
    from qbench.digests import file_key
    from qbench.provenance import external_data_locations

    keys = [file_key(path), *(file_key(path.parent / location) for location in external_data_locations(path))]
    key = tuple(k for k, _ in keys)
    if key in _GRAPH_DIGESTS:
        return _GRAPH_DIGESTS[key]
    digests = _graph_digests(path)
    if all(settled for _, settled in keys):
        if len(_GRAPH_DIGESTS) >= 64:
            _GRAPH_DIGESTS.clear()
        _GRAPH_DIGESTS[key] = digests
    return digests


_GRAPH_DIGESTS: dict[tuple[Any, ...], tuple[str, str]] = {}


def _graph_digests(path: Path) -> tuple[str, str]:
    model = load_model(path)
    digest = hashlib.sha256()
    for opset in sorted((o.domain, o.version) for o in model.opset_import):
        digest.update(repr(opset).encode())
    graph = model.graph
    for info in [*graph.input, *graph.output]:
        digest.update(info.name.encode() + info.type.SerializeToString(deterministic=True))
    for node in graph.node:
        stripped = onnx.NodeProto()
        stripped.CopyFrom(node)
        stripped.name, stripped.doc_string = "", ""
        digest.update(stripped.SerializeToString(deterministic=True))
    kernels = digest.copy()
    for tensor in sorted(graph.initializer, key=lambda t: t.name):
        array = onnx.numpy_helper.to_array(tensor)
        described = f"{tensor.name}:{array.dtype}:{array.shape}".encode()
        digest.update(described + _value_bytes(array))
        shaping = array.dtype == np.int64 or array.dtype == object
        kernels.update(described + (_value_bytes(array) if shaping else bytes([not np.any(array)])))
    return digest.hexdigest(), kernels.hexdigest()


def _value_bytes(array: np.ndarray) -> bytes:
    """The values of an initializer as bytes. A string tensor (a classifier's class names) is an object array, whose
    tobytes() are its strings' addresses in this process: the FP32 file digested twice gave two digests, so a variant
    with nothing to convert was measured again as another model, its timing noise reported as a speed-up."""
    if array.dtype != object:
        return array.tobytes()
    values = [v if isinstance(v, bytes) else str(v).encode() for v in array.reshape(-1)]
    return b"".join(len(v).to_bytes(8, "little") + v for v in values)


def round_trip(source: str, target: str, to: int, *, back: bool = True) -> list[onnx.NodeProto]:
    """Cast FLOAT `source` to the format `to` and (when `back`) to FLOAT again into `target`."""
    label = TensorProto.DataType.Name(to).lower()
    if not back:
        return [helper.make_node("Cast", [source], [target], to=to, name=f"{target}_to_{label}")]
    narrowed = f"{target}_{label}"
    return [
        helper.make_node("Cast", [source], [narrowed], to=to, name=f"{target}_to_{label}"),
        helper.make_node("Cast", [narrowed], [target], to=TensorProto.FLOAT, name=f"{target}_from_{label}"),
    ]
