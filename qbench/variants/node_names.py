"""Which nodes of a model a recipe's node names (`exclude_nodes`) stand for.

A name is a node's own name or a scope (a name path such as an inlined local function's call site); only nodes
of the main graph can be named, since every ONNX build rewrites the main graph only.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator

import onnx

from qbench.errors import QbenchError, did_you_mean
from qbench.variants.onnx_utils import subgraphs_of


def resolve_node_names(model: onnx.ModelProto, names: Iterable[str], variant: str) -> list[str]:
    """The main-graph nodes `names` (e.g. exclude_nodes) stand for (`main_graph_nodes`); a name that stands for
    none is a QbenchError naming the variant."""
    resolved: list[str] = []
    for name in names:
        try:
            resolved += main_graph_nodes(model, name)
        except QbenchError as exc:
            raise QbenchError(f"variant {variant!r}: exclude_nodes: {exc}") from None
    return list(dict.fromkeys(resolved))


def main_graph_nodes(model: onnx.ModelProto, name: str) -> list[str]:
    """The nodes of the main graph `name` stands for: a node's own name, or a scope (a name path such as the call
    site of an inlined local function, `/encoder/layer.3/Block`, or an exporter's `/encoder/layer.3`) standing for
    every node under it.

    A name standing for no node is a QbenchError with the likeliest name meant; so is one standing only for nodes
    inside an If/Loop/Scan body: every technique rewrites the main graph only, so such a node is float whatever
    the recipe says, and accepting its name would claim an exclusion that changed nothing."""
    owners: dict[str, onnx.NodeProto | None] = {}
    for node, owner in _nodes_with_owner(model.graph):
        if node and (node not in owners or owner is None):  # a main-graph node of that name wins
            owners[node] = owner
    known = list(owners)
    if not name:
        raise QbenchError(f"got an empty name; expected a node's name: {_UNNAMED_RULE}{_unnamed_hint(model)}")
    under = [] if name in owners else [k for k in known if k.startswith(f"{name.rstrip('/')}/")]
    matched = [name] if name in owners else under
    if not matched:
        raise QbenchError(f"no node named {name!r} in the model{_node_hint(name, known)}")
    main = [node for node in matched if owners[node] is None]
    if not main:
        owner = owners[matched[0]]
        raise QbenchError(
            f"{name!r} is inside the subgraph of {owner.op_type} node {owner.name!r}, which ONNX builds leave float "
            "(they rewrite the main graph only): there is nothing to "
            "keep in floating point; expected a node of the main graph"
        )
    return main


def _nodes_with_owner(
    graph: onnx.GraphProto, owner: onnx.NodeProto | None = None
) -> Iterator[tuple[str, onnx.NodeProto | None]]:
    """(node name, the main-graph node whose subgraph holds it or None), at any depth."""
    for node in graph.node:
        yield node.name, owner
        for body in subgraphs_of(node):
            yield from _nodes_with_owner(body, owner or node)


_UNNAMED_RULE = "a node the model leaves unnamed is named <op type>_<its position in the main graph, from 0>"


def _unnamed_hint(model: onnx.ModelProto) -> str:
    """The names qbench gave the main graph's unnamed nodes (onnx_utils.name_unnamed_nodes), as far as they show."""
    given = [node.name for index, node in enumerate(model.graph.node)
             if re.fullmatch(rf"{re.escape(node.op_type)}_{index}(_\d+)?", node.name)]  # fmt: skip
    if not given:
        return ""
    shown = ", ".join(repr(k) for k in given[:5]) + (f" and {len(given) - 5} more" if len(given) > 5 else "")
    return f" (here {shown})"


def _node_hint(name: str, known: list[str]) -> str:
    """Did-you-mean for a node name: an inlined node's name in the function body (`matmul`, or onnx's `matmul__2`)
    lists its call sites' names; otherwise the closest node or scope."""
    plain = name.rsplit("/", 1)[-1].split("__")[0]
    inlined = [k for k in known if "/" in k and k.rsplit("/", 1)[-1] == plain]
    if inlined:
        shown = ", ".join(repr(k) for k in inlined[:3]) + (f" and {len(inlined) - 3} more" if len(inlined) > 3 else "")
        return f" (nodes of local functions are named after their call site: {shown})"
    scopes = {k[:i] for k in known for i, c in enumerate(k) if c == "/" and i}
    return did_you_mean(name, [*known, *sorted(scopes)])
