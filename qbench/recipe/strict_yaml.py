"""Read a recipe file's YAML strictly and within bounds, before the schema sees it.

A recipe is a small hand-written file, so anything far outside that is an error,
never a slow or memory-hungry load: the file size is capped, every string and
list is bounded, anchors/aliases may not expand past a node budget (the
"billion laughs" file), nesting is bounded, and a key given twice in one mapping
is an error instead of the last one silently winning. Every problem is a
`RecipeError` naming the file and, where known, the line.

The values of a row filter are compared with data cells, so they are read as YAML 1.2 reads them, not as
PyYAML's YAML 1.1: an unquoted NO (Norway), yes, on, 007 or 010 is the text written, and 1e3 is a number. A number
written with an exponent and no dot (`max_drop: 1e-2`) is a number everywhere, as in YAML 1.2 and JSON.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode

from qbench.errors import RecipeError, short_repr

MAX_RECIPE_BYTES = 1 << 20
"""Largest recipe file read (1 MiB); real recipes are a few KiB."""
MAX_NODES = 100_000
"""Most YAML values after expanding aliases (a billion-laughs file expands past it at once)."""
MAX_DEPTH = 64
"""Deepest nesting of mappings and lists."""
MAX_SCALAR_CHARS = 10_000
"""Longest single string value."""
MAX_ITEMS = 10_000
"""Most entries in one list or mapping."""


def read_recipe_yaml(path: Path) -> tuple[Any, bytes]:
    """The parsed YAML document of the recipe at `path` (a mapping, if the file is a recipe at all) and its bytes."""
    raw = _read_bytes(path)
    try:
        root = yaml.compose(raw, Loader=_StrictLoader)
    except yaml.YAMLError as exc:
        raise _yaml_error(path, exc) from None
    except RecursionError:
        raise RecipeError(path, "", f"invalid YAML: nested more than {MAX_DEPTH} levels deep") from None
    if root is None:
        raise RecipeError(path, "", "the file is empty; expected a mapping with at least name, model and data")
    _check_bounds(path, root)
    _exponents_as_numbers(root, set())
    _filters_as_yaml_1_2(root)
    try:
        return _StrictLoader(raw).construct_document(root), raw
    except yaml.YAMLError as exc:
        raise _yaml_error(path, exc) from None


def _read_bytes(path: Path) -> bytes:
    if path.is_dir():
        raise RecipeError(path, "", "is a folder; expected a recipe YAML file")
    if not path.is_file():
        raise RecipeError(path, "", "recipe file not found" if not path.exists() else "not a regular file")
    try:
        size = path.stat().st_size
        if size > MAX_RECIPE_BYTES:
            raise RecipeError(path, "", f"the file has {size} bytes; a recipe is at most {MAX_RECIPE_BYTES} bytes")
        raw = path.read_bytes()
    except OSError as exc:
        raise RecipeError(path, "", f"cannot read the recipe: {exc.strerror or exc}") from None
    if b"\x00" in raw[:4096] and not raw.startswith((b"\xff\xfe", b"\xfe\xff")):
        raise RecipeError(path, "", "the file holds binary data (NUL bytes); expected a YAML text file")
    return raw


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key given twice in one mapping (YAML 1.2 says keys are unique)."""

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Any, Any]:
        first_line: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == _MERGE_TAG:  # `<<: *defaults` may be overridden by explicit keys
                continue
            if not isinstance(key_node, ScalarNode):
                raise yaml.constructor.ConstructorError(
                    None, None, "a mapping key must be a single value, not a list or mapping", key_node.start_mark
                )
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            if key in first_line:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {short_repr(key)} (first at line {first_line[key]})",
                    key_node.start_mark
                )
            first_line[key] = line
        return super().construct_mapping(node, deep=deep)


_MERGE_TAG = "tag:yaml.org,2002:merge"


def _check_bounds(path: Path, root: Node) -> None:
    """Walk the node graph once per distinct node, counting what aliases would expand to."""
    expanded: dict[int, int] = {}
    active: set[int] = set()

    def size(node: Node, depth: int) -> int:
        key = id(node)
        if key in expanded:
            return expanded[key]
        line = node.start_mark.line + 1
        if key in active:
            raise RecipeError(path, f"line {line}", "an alias refers to the mapping or list that contains it")
        if depth > MAX_DEPTH:
            raise RecipeError(path, f"line {line}", f"nested more than {MAX_DEPTH} levels deep")
        if isinstance(node, ScalarNode):
            if len(node.value) > MAX_SCALAR_CHARS:
                shown = short_repr(node.value)
                raise RecipeError(
                    path, f"line {line}", f"a value of {len(node.value)} characters "
                                          f"({shown}); at most {MAX_SCALAR_CHARS}"
                )
            expanded[key] = 1
            return 1
        children: list[Node] = (
            [n for pair in node.value for n in pair] if isinstance(node, MappingNode) else list(node.value)
        )
        if len(node.value) > MAX_ITEMS:
            kind = "mapping" if isinstance(node, MappingNode) else "list"
            raise RecipeError(path, f"line {line}", f"a {kind} of {len(node.value)} entries; at most {MAX_ITEMS}")
        active.add(key)
        total = 1
        for child in children:
            total += size(child, depth + 1)
            if total > MAX_NODES:
                raise RecipeError(
                    path,
                    f"line {line}",
                    f"anchors and aliases expand to more than {MAX_NODES} values; a recipe is a small file",
                )
        active.discard(key)
        expanded[key] = total
        return total

    size(root, 0)


def _yaml_error(path: Path, exc: yaml.YAMLError) -> RecipeError:
    mark = getattr(exc, "problem_mark", None)
    where = f"line {mark.line + 1}" if mark is not None else ""
    problem = getattr(exc, "problem", None) or str(exc)
    context = getattr(exc, "context", None)
    detail = f"{context}: {problem}" if context else problem
    return RecipeError(path, where, f"invalid YAML: {detail}")


_STR_TAG, _BOOL_TAG, _INT_TAG, _FLOAT_TAG = (f"tag:yaml.org,2002:{kind}" for kind in ("str", "bool", "int", "float"))
_YAML_1_2 = {  # the YAML 1.2 core schema's plain scalars of each type (its null, ~ and empty, is YAML 1.1's too)
    _BOOL_TAG: re.compile(r"true|True|TRUE|false|False|FALSE"),
    _INT_TAG: re.compile(r"[-+]?(?:0|[1-9][0-9]*)"),  # no leading zero: 007 is a code, 010 is not octal 8
    _FLOAT_TAG: re.compile(r"[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)"
                           r"|\.(?:nan|NaN|NAN)"),
}


_EXPONENT = re.compile(r"[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)[eE][-+]?[0-9]+")  # YAML 1.2's floats that have one


def _filters_as_yaml_1_2(root: Node) -> None:
    """Re-tag the plain scalars under each `filter` key (data.calibration, data.evaluation, a slice, a variant's
    training rows) as YAML 1.2 would resolve them. PyYAML's YAML 1.1 made `country: {in: [NO, SE]}` select only SE
    (NO read as false), `code: 010` select the rows of code 8 (octal), `t: 12:30` the rows of 750 (base 60), and
    `amount: 1e3` the text '1e3'. Only filters (but for exponents: _exponents_as_numbers): elsewhere a recipe's values
    meet a typed field that refuses the wrong type; a filter's meet data cells, which silently differ."""
    _each_filter(root, set())


def _exponents_as_numbers(node: Node, seen: set[int]) -> None:
    """Tag each plain value (not a key) YAML 1.1 leaves text for want of a dot and YAML 1.2 reads as a number (1e-2,
    5E3) a float. PyYAML kept `gate.max_drop: 1e-2` the text '1e-2', and the schema refused it as `expected a number,
    got '1e-2'`: 0.01 as most people write it, and as YAML 1.2, JSON and Python read it."""
    if id(node) in seen:
        return
    seen.add(id(node))
    if isinstance(node, ScalarNode):
        if node.style is None and node.tag == _STR_TAG and _EXPONENT.fullmatch(node.value):
            node.tag = _FLOAT_TAG
        return
    for child in [value for _, value in node.value] if isinstance(node, MappingNode) else node.value:
        _exponents_as_numbers(child, seen)


def _each_filter(node: Node, seen: set[int]) -> None:
    if id(node) in seen:  # aliases share nodes
        return
    seen.add(id(node))
    if isinstance(node, MappingNode):
        for key, value in node.value:
            if isinstance(key, ScalarNode) and key.value == "filter":
                _retag(value, set())
            else:
                _each_filter(value, seen)
    elif not isinstance(node, ScalarNode):
        for item in node.value:
            _each_filter(item, seen)


def _retag(node: Node, seen: set[int]) -> None:
    if id(node) in seen:
        return
    seen.add(id(node))
    if isinstance(node, ScalarNode):
        if node.style is None:  # plain: quoted scalars are text already
            node.tag = _yaml_1_2_tag(node)
        return
    for child in [n for pair in node.value for n in pair] if isinstance(node, MappingNode) else node.value:
        _retag(child, seen)


def _yaml_1_2_tag(node: ScalarNode) -> str:
    if node.tag in (_BOOL_TAG, _INT_TAG, _FLOAT_TAG) and not _YAML_1_2[node.tag].fullmatch(node.value):
        return _STR_TAG
    if node.tag == _STR_TAG and _YAML_1_2[_FLOAT_TAG].fullmatch(node.value):
        return _FLOAT_TAG  # 1e3: YAML 1.1 wants a dot in a float
    return node.tag
