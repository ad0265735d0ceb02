"""One rule for every object of results.json: only the fields of the dataclass it is read as.

qbench writes each section from its dataclass's fields and nothing else, so a key this qbench does not
know was written by another qbench (a newer one, say, recording a figure that changes the verdict) or
added by hand. The gate fails closed: such results are refused with the field named (and, by
`read_results`, the qbench version that wrote them), never judged with the field silently dropped.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from qbench.errors import QbenchError, did_you_mean, short_repr


def known_fields(raw: Any, cls: type, where: str, *, extra: tuple[str, ...] = ()) -> dict[str, Any]:
    """`raw`, the JSON object at `where` read as `cls`, once it holds no key but `cls`'s fields (and `extra`)."""
    if not isinstance(raw, dict):
        raise QbenchError(f"{where}: got {type(raw).__name__}, expected a JSON object")
    names = [f.name for f in dataclasses.fields(cls)] + list(extra)
    unknown = [key for key in raw if key not in names]
    if unknown:
        key = str(unknown[0])
        raise QbenchError(f"{where}: unknown field {short_repr(key)}{did_you_mean(key, names)}: this qbench does not "
                          "know it, and judges no results it would read without it")  # fmt: skip
    return raw
