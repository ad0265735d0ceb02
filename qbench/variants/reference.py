"""The FP32 graph every technique builds from, and the checks every built model passes before it counts as built.

ONNX Runtime runs graphs that ONNX's own tools and ORT's converters do not expect: nodes out of topological order
(ORT's FP16 converter writes such graphs), and graph outputs that no node produces (a graph input passed through under
its own name, an initializer listed as an output). The onnx checker and version converter refuse an unsorted graph;
ORT's FP16 converter and static quantizer assume every output has a producer. `load_reference` gives the builders one
normal form of the recipe's model, computing the same outputs:

- nodes sorted topologically, in every subgraph too (node names are given first, from the file's own order);
- an initializer listed as an output is produced by an Identity under the output's name (the initializer takes a new
  name, which its readers read), so outputs keep their names and order;
- a graph input listed as an output is set aside: no node may produce a name a graph input holds, and the output
  is the input whatever a variant computes. `settle_built_model` puts it back, in its place, in every built model;
- an initializer the file also lists as a graph input (every one in IR 3, ONNX 1.3's old exporters and model zoos;
  PyTorch's `keep_initializers_as_inputs`) is a plain initializer: qbench never feeds it (the recipe's inputs, the
  Triton config and the checks of the interface read the inputs without a default), so every variant holds it as
  the constant it is in every measurement, converted as its precision converts weights. Kept an input, FP16 stored
  the weights in float32 behind Casts, FP8 left them unquantized, and static INT8 dropped them while dynamic INT8
  kept some: each variant had another interface and another share of the graph in its precision;
- a CastLike whose target's type is known is the Cast to that type. PyTorch's dynamo exporter writes
  `w.type_as(x)` as CastLike(w, x): the weight it widens (float16, bfloat16 stored) then read as computed from the
  activation `x`, so constant folding left it, the INT8 and FP8 quantizers took it for an activation (quantized
  with the calibrator's range, per tensor, no weight of the layer counted as quantized) and the MatMul for one of
  two activations;
- IR version 4 at least: before it every initializer had to be listed as a graph input too, so each scale, zero
  point or rewritten weight a builder adds would make the model invalid.

The FP32 reference that is measured stays the recipe's own file. Every built model is settled (set-aside outputs
back, the fed inputs in the reference's order, nodes sorted) and passes the onnx checker and the check that its fed
inputs are the reference's (`check_built_model`) before it counts as built; `constant_inputs` names the
initializer-inputs a built variant holds as constants (its build notes say so).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import onnx
from onnx import helper

from qbench.errors import QbenchError, one_line
from qbench.preflight.precision import value_types
from qbench.variants.base import BuiltVariant
from qbench.variants.onnx_utils import (
    all_nodes,
    check_model_against,
    load_model,
    rename_reads,
    sort_nodes,
    subgraphs_of,
)

_INITIALIZERS_APART_IR = 4  # the first IR version whose initializers need not be listed as graph inputs


def load_reference(path: Path) -> onnx.ModelProto:
    """The model at `path` (loaded as `load_model` does) in the normal form the variants are built from."""
    model = load_model(path)
    try:
        normalise(model)
    except QbenchError as exc:
        raise QbenchError(f"{path}: {exc}") from None
    return model


def normalise(model: onnx.ModelProto) -> None:
    """Sort the nodes, give initializer outputs a producer, set graph-input outputs aside and raise the IR version to
    one where initializers need not be graph inputs, in place."""
    model.ir_version = max(model.ir_version, _INITIALIZERS_APART_IR)
    graph = model.graph
    sort_nodes(graph)
    _cast_likes_as_casts(model)
    defaults = {tensor.name for tensor in graph.initializer}
    if any(value.name in defaults for value in graph.input):
        fed = [onnx.ValueInfoProto.FromString(value.SerializeToString()) for value in graph.input
               if value.name not in defaults]  # fmt: skip
        graph.ClearField("input")
        graph.input.extend(fed)
    _produce_initializer_outputs(graph)
    inputs = {value.name for value in graph.input}
    kept = [output for output in graph.output if output.name not in inputs]
    if len(kept) < len(graph.output):
        kept = [onnx.ValueInfoProto.FromString(output.SerializeToString()) for output in kept]
        graph.ClearField("output")
        graph.output.extend(kept)


def _cast_likes_as_casts(model: onnx.ModelProto) -> None:
    """Each standard CastLike, in every subgraph too, whose second input's element type is known becomes the Cast to
    that type (its saturate attribute kept), in place: the same values, read from its first input alone."""
    cast_likes = [node for node in all_nodes(model.graph)
                  if node.op_type == "CastLike" and node.domain in ("", "ai.onnx")]  # fmt: skip
    if not cast_likes:
        return  # the usual graph: no shape inference
    types = value_types(model)
    for node in cast_likes:
        to = types.get(node.input[1]) if len(node.input) > 1 else None
        if to is None:
            continue
        node.op_type = "Cast"
        del node.input[1:]
        node.attribute.append(helper.make_attribute("to", to))


def _produce_initializer_outputs(graph: onnx.GraphProto) -> None:
    """An Identity for each output that is an initializer (and no graph input): it reads the initializer, renamed."""
    inputs = {value.name for value in graph.input}
    produced = {name for node in graph.node for name in node.output}
    initializers = {tensor.name for tensor in graph.initializer}
    constant = list(dict.fromkeys(
        output.name for output in graph.output
        if output.name in initializers and output.name not in inputs and output.name not in produced
    ))  # fmt: skip
    if not constant:
        return
    taken = names_in(graph)
    renamed = {name: fresh_name(f"{name}_value", taken) for name in constant}
    for tensor in graph.initializer:
        tensor.name = renamed.get(tensor.name, tensor.name)
    for node in graph.node:
        node.input[:] = [renamed.get(name, name) for name in node.input]
        for body in subgraphs_of(node):
            rename_reads(body, renamed)
    identities = [
        helper.make_node("Identity", [value], [name], name=fresh_name(f"{name}_output", taken))
        for name, value in renamed.items()
    ]
    nodes = [*identities, *graph.node]  # they read initializers only: first keeps the graph sorted
    graph.ClearField("node")
    graph.node.extend(nodes)


def names_in(graph: onnx.GraphProto) -> set[str]:
    """Every value and node name `graph` and its subgraphs use (a new name must clash with none)."""
    names = {value.name for value in [*graph.input, *graph.output, *graph.value_info]}
    names |= {tensor.name for tensor in graph.initializer}
    for node in graph.node:
        names.update([node.name, *node.input, *node.output])
        for body in subgraphs_of(node):
            names |= names_in(body)
    return names


def fresh_name(base: str, taken: set[str]) -> str:
    """`base`, or `base_<n>` for the first n that makes it unused; the name is then taken."""
    name, n = base, 0
    while name in taken:
        n += 1
        name = f"{base}_{n}"
    taken.add(name)
    return name


@dataclass(frozen=True)
class _Interface:
    """What a built model must keep of the reference's interface."""

    passthrough: tuple[tuple[int, bytes, bytes], ...]  # (index, output, input) of each output that is a fed input
    fed: tuple[str, ...]  # the graph inputs without a default, in order: what a caller feeds
    constant: tuple[str, ...]  # the graph inputs with an initializer default, which `normalise` makes constants


@functools.lru_cache(maxsize=8)
def _read_interface(path: str, stamp: tuple[int, int]) -> _Interface:
    """The interface of the model at `path`; `stamp` (modification time, size) keys the cache, so a rewritten file
    is read again."""
    del stamp
    graph = onnx.load(path, load_external_data=False).graph
    defaults = {tensor.name for tensor in graph.initializer}
    inputs = {value.name: value for value in graph.input if value.name not in defaults}
    passthrough = tuple(
        (index, output.SerializeToString(), inputs[output.name].SerializeToString())
        for index, output in enumerate(graph.output)
        if output.name in inputs
    )
    constant = tuple(value.name for value in graph.input if value.name in defaults)
    return _Interface(passthrough, tuple(inputs), constant)


def _interface(reference: Path) -> _Interface:
    stat = reference.stat()
    return _read_interface(str(reference.resolve()), (stat.st_mtime_ns, stat.st_size))


def constant_inputs(reference: Path) -> tuple[str, ...]:
    """The reference's graph inputs that have an initializer default, which every built variant holds as constants."""
    return _interface(reference).constant


def settle_built_model(artifact: Path, reference: Path) -> onnx.ModelProto:
    """Make the built model at `artifact` whole, in place; returns it as saved (external data not loaded), for the
    checks that read its graph.

    The reference's outputs that are graph inputs (set aside by `normalise`) come back, each at its index among the
    outputs, with its input if the build dropped it. The nodes are sorted topologically: ORT's quantizers order
    nodes without counting what a subgraph reads by name, and ORT's FP16 converter appends its Casts after their
    readers (ONNX Runtime runs both; the onnx checker and other runtimes refuse them).
    """
    model = onnx.load(str(artifact), load_external_data=False)
    changed = _restore_passthrough_outputs(model.graph, reference)
    changed = _order_fed_inputs(model.graph, _interface(reference).fed) or changed
    changed = sort_nodes(model.graph) or changed
    if changed:
        onnx.save_model(model, str(artifact))
    return model


def _order_fed_inputs(graph: onnx.GraphProto, fed: tuple[str, ...]) -> bool:
    """The graph inputs the reference feeds first, in its order (a builder may reorder them); whether that moved any."""
    rank = {name: index for index, name in enumerate(fed)}
    ordered = sorted(graph.input, key=lambda value: rank.get(value.name, len(rank)))  # stable: the rest keep theirs
    if [value.name for value in ordered] == [value.name for value in graph.input]:
        return False
    ordered = [onnx.ValueInfoProto.FromString(value.SerializeToString()) for value in ordered]
    graph.ClearField("input")
    graph.input.extend(ordered)
    return True


def _restore_passthrough_outputs(graph: onnx.GraphProto, reference: Path) -> bool:
    set_aside = _interface(reference).passthrough
    present = {output.name for output in graph.output}
    missing = [entry for entry in set_aside if onnx.ValueInfoProto.FromString(entry[1]).name not in present]
    if not missing:
        return False
    outputs = [onnx.ValueInfoProto.FromString(output.SerializeToString()) for output in graph.output]
    inputs = {value.name for value in graph.input}
    for index, output_bytes, input_bytes in missing:
        output = onnx.ValueInfoProto.FromString(output_bytes)
        outputs.insert(index, output)
        if output.name not in inputs:
            graph.input.append(onnx.ValueInfoProto.FromString(input_bytes))
    graph.ClearField("output")
    graph.output.extend(outputs)
    return True


def check_built_model(built: BuiltVariant, reference: Path) -> None:
    """Run the onnx checker on the saved variant, and check that a caller feeds it what it feeds the reference: the
    same inputs without a default, in the same order. A variant that dropped one would be served (the Triton config
    writes the variant's inputs) and measured as if the input did not matter; one that added one could not be fed
    at all. A checker error the reference itself has (ONNX Runtime runs it: a graph input of unknown rank, which
    the checker wants a shape for) is the model's, kept by the build, not a defect of the build; any other fails."""
    try:
        check_model_against(built.onnx_path, reference)
    except Exception as exc:  # noqa: BLE001 - the checker raises ValidationError, protobuf and IO errors
        raise QbenchError(
            one_line(f"variant {built.name!r}: the built model {built.onnx_path.name} is not valid ONNX: {exc}")
        ) from exc
    expected = _interface(reference).fed
    got = _interface(built.onnx_path).fed
    if got != expected:
        raise QbenchError(f"variant {built.name!r}: the built model {built.onnx_path.name} takes the inputs "
                          f"{', '.join(got) or 'none'}; expected the FP32 "
                          f"model's {', '.join(expected)}, in that order")  # fmt: skip
