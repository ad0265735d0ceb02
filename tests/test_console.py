"""The CLI's rich console."""

from __future__ import annotations

import io

from rich.markup import escape

from qbench.console import CliConsole


def test_emoji_codes_in_a_message_print_as_written() -> None:
    """`the ONNX export of mypkg.models:loop: ...` printed as `mypkg.models➿ ...`: rich replaced `:loop:`."""
    out = io.StringIO()
    CliConsole(file=out, width=200).print(f"[red]error:[/] {escape('the ONNX export of mypkg.models:loop: follows')}")
    assert out.getvalue() == "error: the ONNX export of mypkg.models:loop: follows\n"
