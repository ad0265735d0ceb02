"""`qbench ARGS` in a child process that gets a signal (or an unexpected exception) right after a chosen function
returns, mid-command."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Mapping
from pathlib import Path

HOOK = textwrap.dedent("""\
    import importlib, os, sys, threading
    module_name, attribute, action = sys.argv[1], sys.argv[2], sys.argv[3]
    owner = importlib.import_module(module_name)
    *path, attribute = attribute.split(".")  # a function, or a class's method: Class.method
    for name in path:
        owner = getattr(owner, name)
    original = getattr(owner, attribute)
    def signalled(*args, **kwargs):
        result = original(*args, **kwargs)
        if action == "raise":  # a bug: an exception no code of qbench's expects
            raise RuntimeError(f"an unexpected error right after {attribute}")
        signum = int(action)
        assert threading.current_thread() is threading.main_thread(), "the signal must land on the main thread"
        os.kill(os.getpid(), signum)  # CPython runs the handler before os.kill returns: it raised, or held it back
        return result
    setattr(owner, attribute, signalled)
    from qbench.cli.app import main
    sys.exit(main(sys.argv[4:]))
""")


IMPORT_HOOK = textwrap.dedent("""\
    import os, sys
    module_name, signum = sys.argv[1], int(sys.argv[2])
    class SignalOnImport:
        def find_spec(self, name, path=None, target=None):
            if name == module_name:
                sys.meta_path.remove(self)
                os.kill(os.getpid(), signum)  # the handler runs here: in the middle of the import
            return None  # the usual finders import it
    sys.meta_path.insert(0, SignalOnImport())
    from qbench.cli.app import main
    sys.exit(main(sys.argv[3:]))
""")


def run_signalled_importing(module: str, signum: int, *args: str, env: Mapping[str, str],
                            cwd: Path | None = None) -> subprocess.CompletedProcess[str]:  # fmt: skip
    """`qbench ARGS` that receives `signum` as it starts importing `module` (the command's own imports)."""
    return subprocess.run([sys.executable, "-c", IMPORT_HOOK, module, str(int(signum)), *args],
                          capture_output=True, text=True, env=dict(env), cwd=cwd, timeout=120, check=False)  # fmt: skip


def run_signalled(hook: str, signum: int, *args: str, env: Mapping[str, str],
                  cwd: Path | None = None) -> subprocess.CompletedProcess[str]:  # fmt: skip
    """`qbench ARGS` that receives `signum` right after `hook` (module:function or module:Class.method) returns, in the
    middle of the command."""
    module, attribute = hook.split(":")
    return subprocess.run([sys.executable, "-c", HOOK, module, attribute, str(int(signum)), *args],
                          capture_output=True, text=True, env=dict(env), cwd=cwd, timeout=120, check=False)  # fmt: skip


def run_raising(hook: str, *args: str, env: Mapping[str, str],
                cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """`qbench ARGS` in which `hook` (module:function or module:Class.method) raises a RuntimeError once it returned."""
    module, attribute = hook.split(":")
    return subprocess.run([sys.executable, "-c", HOOK, module, attribute, "raise", *args],
                          capture_output=True, text=True, env=dict(env), cwd=cwd, timeout=120, check=False)  # fmt: skip
