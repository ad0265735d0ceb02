"""The FP32 reference must load on every backend the recipe names, checked before anything is built.

A model the runtime cannot load (an IR version or operator set newer than it knows, an operator of a domain no
provider implements) would otherwise fail every variant built from it, one long error per variant. A backend that
can check a model file cheaply declares `check_loads(path)` (qbench.backends.onnxruntime); one that runs a torch
module, or whose loading is a build of its own, does not, and reports at its first load as before."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from qbench.backends import get_backend
from qbench.errors import MachineSetupError, QbenchError, RecipeError, one_line
from qbench.recipe.spec import Recipe

if TYPE_CHECKING:
    import onnx


def check_reference_loads(recipe: Recipe, path: Path, field: str) -> None:
    """RecipeError at `field` (model.path / model.torch) naming the backend, the runtime's reason, the model's own
    version stamps and what the runtime implements, for the first backend that cannot load the model at `path`."""
    for index, name in enumerate(recipe.backends):
        backend = get_backend(name)
        check = getattr(backend, "check_loads", None)
        if check is None:
            continue
        try:
            check(path)
        except QbenchError as exc:
            where = f"{name} (backends[{index}])" if len(recipe.backends) > 1 else name
            # what this machine lacks (a locale) is no matter of the model's versions: its stamps would mislead
            stamps = "" if isinstance(exc, MachineSetupError) else f"; {_stamps(path, backend)}"
            raise RecipeError(recipe.source, field, f"{path}: the FP32 reference does not load on {where}: {exc}"
                              f"{stamps}") from None  # fmt: skip


def _stamps(path: Path, backend: object) -> str:
    """What the model asks for (IR version, operator sets) against what the backend's runtime implements, and the
    fix; just the fix where the file cannot be parsed. Where every stamp is one the runtime and onnx know, yet the
    onnx checker rejects the graph (a tensor defined twice, as torch.onnx's dynamo exporter writes one where a module
    returns an input unchanged or an output is named after a tensor inside the graph), or two nodes of one graph share a
    name (which the checker accepts and ONNX Runtime refuses), that is the cause and the fix says so: re-exporting at
    other versions would not help."""
    import onnx

    fix = ("expected a model this runtime loads: export it at an IR version and opsets it supports, with operators "
           "it implements (or register the custom operators' "
           "library), or install a runtime that supports it")  # fmt: skip
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception:  # noqa: BLE001 - the runtime's own reason already says what is wrong with the file
        return fix
    opsets = {entry.domain or "ai.onnx": entry.version for entry in model.opset_import}
    asked = ", ".join(f"{domain} {version}" for domain, version in opsets.items())
    implemented = getattr(backend, "implemented_opsets", lambda: {})()
    known = ", ".join(f"{domain} up to {implemented[domain]}" if domain in implemented else f"{domain} not at all"
                      for domain in {"ai.onnx": 0, **opsets})  # fmt: skip
    runtime = f"; the runtime implements opsets {known}" if implemented else ""
    stamps = f"the model is IR version {model.ir_version} with opsets {asked}{runtime}"
    if _beyond_known_versions(model, opsets, implemented):
        return f"{stamps}; {fix}"
    shared = _shared_node_name(model.graph)
    if shared is not None:  # the onnx checker accepts it; ONNX Runtime refuses a graph with two nodes of one name
        name, count = shared
        return (f"{stamps}, versions it knows, but {count} nodes of one graph share the name {name!r}; expected each "
                "node's name unique in its graph (or empty): re-export the model or rename those nodes")  # fmt: skip
    invalid = _checker_refusal(model)
    if invalid is None:
        return f"{stamps}; {fix}"
    names = (": a name is defined twice, so give every output a name no tensor inside the graph has, and return no "
             "input unchanged as an output" if "static assignment" in invalid else "")  # fmt: skip
    return (f"{stamps}, versions it knows, but the graph itself is not valid ONNX (onnx checker: {invalid}); expected "
            f"a valid graph: re-export the model or repair the graph{names}")  # fmt: skip


def _beyond_known_versions(model: onnx.ModelProto, opsets: dict[str, int], implemented: dict[str, int]) -> bool:
    """Whether the model's IR version or an operator set is newer than onnx knows, or than (or unknown to) the runtime
    (where it lists what it implements): then the stamps are the likelier cause."""
    import onnx

    if model.ir_version > onnx.IR_VERSION or opsets.get("ai.onnx", 0) > onnx.defs.onnx_opset_version():
        return True
    return bool(implemented) and any(version > implemented.get(domain, -1) for domain, version in opsets.items())


def _shared_node_name(graph: onnx.GraphProto) -> tuple[str, int] | None:
    """The first non-empty node name that several nodes of `graph` (or of a subgraph, each judged alone) share, with
    how many share it; None where every graph names its nodes apart. Converters write such names (one per op type,
    or a layer's name on each of its nodes); ONNX Runtime refuses the graph, and exclude_nodes could not tell them
    apart."""
    from collections import Counter

    counts = Counter(node.name for node in graph.node if node.name)
    name, count = counts.most_common(1)[0] if counts else ("", 0)
    if count > 1:
        return name, count
    subgraphs = (a.g for node in graph.node for a in node.attribute if a.type == a.GRAPH)
    subgraph_lists = (g for node in graph.node for a in node.attribute if a.type == a.GRAPHS for g in a.graphs)
    return next((found for g in (*subgraphs, *subgraph_lists) if (found := _shared_node_name(g))), None)


def _checker_refusal(model: onnx.ModelProto) -> str | None:
    """The onnx checker's reason for refusing the graph, on one line, or None where it accepts it. Tensors stored
    outside the file are made graph inputs of a copy first: the checker would look for their files, which the
    preflight checks on its own, and their values say nothing about the graph's structure."""
    import onnx

    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    external = [t for t in copy.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
    inputs = {value.name for value in copy.graph.input}
    for tensor in external:
        if tensor.name not in inputs:
            copy.graph.input.append(onnx.helper.make_tensor_value_info(tensor.name, tensor.data_type, tensor.dims))
        copy.graph.initializer.remove(tensor)
    try:
        onnx.checker.check_model(copy)
    except onnx.checker.ValidationError as exc:
        return one_line(exc)
    return None
