"""`qbench cache prune`: bound the build store's disk use (qbench.execute.cache)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Optional

import typer

from qbench.console import make_console
from qbench.errors import QbenchError, short_repr

cache_app = typer.Typer(no_args_is_help=True, help="Inspect and bound qbench's build store.")
out = make_console(stderr=False)

_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?", re.IGNORECASE)
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(text: str) -> int:
    """Bytes of a size such as `500M`, `20G`, `1.5TiB` or `1048576` (binary units, as `du -h` shows them)."""
    match = _SIZE.fullmatch(text.strip())
    if match is None:
        raise QbenchError(f"--max-size: got {short_repr(text)}, expected a size such as 500M or 20G")
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])


def human_size(size: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"


@cache_app.command(name="prune")
def prune_command(
    older_than: Annotated[
        Optional[float], typer.Option("--older-than", help="remove entries unused for this many days", min=0,
                                      show_default=False, metavar="DAYS")  # fmt: skip
    ] = None,
    max_size: Annotated[
        Optional[str], typer.Option("--max-size", help="then remove the least recently used entries until the store "
                                    "fits in this size (500M, 20G)", show_default=False, metavar="SIZE")  # fmt: skip
    ] = None,
    store: Annotated[
        Optional[Path], typer.Option("--store", help="the build store folder (a recipe's executor.store); default: "
                                     "the builds folder of qbench's cache", show_default=False)  # fmt: skip
    ] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="list what would be removed, remove nothing")] = False,
) -> int:
    """Remove build store entries (builds and input copies), least recently used first; never one a running
    sweep uses. Prints what was removed and the space freed."""
    from qbench.execute.cache import prune
    from qbench.files import cache_dir

    if older_than is None and max_size is None:
        raise QbenchError("qbench cache prune: expected --older-than DAYS, --max-size SIZE or both")
    max_bytes = parse_size(max_size) if max_size is not None else None
    root = store if store is not None else cache_dir() / "builds"
    if not root.is_dir():
        if root.exists():
            raise QbenchError(f"--store: {root} is a file; expected a build store folder")
        out.print(f"nothing to prune: no build store at {root}", markup=False)
        return 0
    done = prune(root, older_than_days=older_than, max_bytes=max_bytes, dry_run=dry_run)
    verb = "would remove" if dry_run else "removed"
    for entry in done.removed:
        out.print(f"{verb} {entry.kind} {entry.path} ({human_size(entry.size)})", markup=False)
    kept = sum(entry.size for entry in done.kept + done.in_use)
    busy = f", {len(done.in_use)} of them in use by a running sweep" if done.in_use else ""
    out.print(f"{root}: {verb} {len(done.removed)} entries, {'would free' if dry_run else 'freed'} "
              f"{human_size(done.freed)}; kept {len(done.kept) + len(done.in_use)} ({human_size(kept)}){busy}",
              markup=False)  # fmt: skip
    return 0
