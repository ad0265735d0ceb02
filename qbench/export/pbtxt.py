"""Protocol-buffer text format (.pbtxt) from plain Python values, without the protobuf schema.

A message is a mapping of field name -> value: a str (quoted), an int, a bool, an `EnumValue`
(written bare), a list of scalars (`dims: [ 1, 8, 8 ]`), a nested mapping (a sub-message) or a
list of mappings (a repeated message, one `name { ... }` block per element; protobuf maps are
repeated `{key, value}` messages). Fields are written in the mapping's order.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from google.protobuf.text_encoding import CEscape

_INDENT = "  "


class EnumValue(str):
    """A protobuf enum value such as TYPE_FP32: written without quotes."""


def _scalar(value: object) -> str:
    if isinstance(value, EnumValue):
        return str(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return '"' + CEscape(value, as_utf8=True) + '"'  # as protobuf writes it: a tab in a tensor name reads back
    raise TypeError(f"no protobuf text form for {type(value).__name__}: {value!r}")


def _is_messages(value: object) -> bool:
    return isinstance(value, Sequence) and not isinstance(value, str) and all(isinstance(v, Mapping) for v in value)


def message_lines(fields: Mapping[str, Any], depth: int = 0) -> list[str]:
    """The lines of one message's fields at `depth` levels of indentation."""
    pad = _INDENT * depth
    lines: list[str] = []
    for name, value in fields.items():
        if isinstance(value, Sequence) and not isinstance(value, str) and not value:
            continue  # an empty repeated field is the same as an absent one
        if isinstance(value, Mapping):
            lines += [f"{pad}{name} {{", *message_lines(value, depth + 1), f"{pad}}}"]
        elif _is_messages(value):
            for element in value:
                lines += [f"{pad}{name} {{", *message_lines(element, depth + 1), f"{pad}}}"]
        elif isinstance(value, Sequence) and not isinstance(value, str):
            lines.append(f"{pad}{name}: [ {', '.join(_scalar(v) for v in value)} ]")
        else:
            lines.append(f"{pad}{name}: {_scalar(value)}")
    return lines


def to_pbtxt(fields: Mapping[str, Any]) -> str:
    return "\n".join(message_lines(fields)) + "\n"
