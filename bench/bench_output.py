"""What every benchmark ends with: its figures as JSON at the path it was given (a helper, run as part of a bench)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rich.console import Console


def write_json(path: Path, report: dict[str, Any], console: Console) -> int:
    """Write `report` to `path` (folders made as needed), say where, and return the bench's exit code, 0."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2, default=str) + "\n")
    console.print(f"written: {path}")
    return 0
