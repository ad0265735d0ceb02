"""Facts about the machine that change measured results: recorded with every sweep.

INT8 accuracy on x86 depends on the CPU: without VNNI, ORT's u8s8 kernels can
saturate (vpmaddubsw), so reduce_range='auto' turns on 7-bit weights there.
"""

from __future__ import annotations

import functools
import os
import platform
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterable
from importlib import metadata
from typing import Any

_CPU_FLAGS_OF_INTEREST = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_int8", "fma", "f16c")


@functools.cache
def cpu_flags() -> frozenset[str]:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def cpu_has_vnni() -> bool:
    return bool({"avx512_vnni", "avx_vnni"} & cpu_flags())


def needs_reduce_range() -> bool:
    """True on x86 CPUs whose int8 dot products can saturate (no VNNI)."""
    return platform.machine().lower() in ("x86_64", "amd64", "i686") and not cpu_has_vnni()


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


@functools.cache
def package_version(package: str) -> str | None:
    """The installed distribution's version (None: not installed), read once per process: a lookup scans every
    folder on sys.path, and a package upgraded under a running process is not the one it has imported."""
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def describe_environment() -> dict[str, Any]:
    return {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpu_flags": sorted(f for f in _CPU_FLAGS_OF_INTEREST if f in cpu_flags()),
        "packages": {
            p: package_version(p)
            for p in ("qbench", "onnx", "onnxruntime", "onnxruntime-gpu", "numpy", "mlflow", "torch", "nvidia-modelopt")
            if package_version(p)
        },
    }


def timing_machine(device: str | None = None) -> dict[str, Any]:
    """The machine a measurement's timings come from, recorded with them: its host name, and what makes two
    machines time alike (`machine_kind`). On a cluster each measurement may run on another node."""
    machine: dict[str, Any] = {"host": socket.gethostname(), "cpu": _cpu_model(), "cpus": _usable_cpus(),
                               "arch": platform.machine()}  # fmt: skip
    if device:
        machine["device"] = device
    return machine


def _usable_cpus() -> int | None:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def package_versions(packages: Iterable[str]) -> dict[str, str]:
    """Each distribution's installed version ("absent" where it is not installed): the package facts of a build's key
    and of a measurement's record."""
    return {name: package_version(name) or "absent" for name in packages}


def measurement_facts(packages: Iterable[str], threads: int | None, gpu: bool = False) -> dict[str, str]:
    """What a measurement's figures depend on beyond its model and the recipe, here: the installed versions of the
    runtime `packages` that computed them, and the machine facts latency depends on (CPU model, usable CPUs,
    architecture, the threads asked for; none: the runtime's default, which follows the CPUs; with `gpu`, a backend
    computing on a GPU, the GPU's model, "none" without one). A resumed sweep reuses a measurement only where they are
    today's (qbench.execute.resume), so one table never mixes runtimes or machines. A CPU backend's facts leave the
    GPU out: another GPU in the machine does not change what it measures."""
    facts = {**package_versions(packages), "cpu": _cpu_model(), "cpus": str(_usable_cpus()), "machine": platform.machine(),
             "threads": str(threads) if threads is not None else "runtime default"}  # fmt: skip
    return facts | {"gpu": gpu_model() or "none"} if gpu else facts


@functools.cache
def gpu_model() -> str | None:
    """The model of the GPU this process computes on (CUDA device 0 as it sees it), None on a machine without one.

    From torch where it is already imported and sees CUDA (importing torch only to ask takes seconds), else from
    nvidia-smi, asked about the first device CUDA_VISIBLE_DEVICES leaves visible (nvidia-smi ignores that variable;
    an empty one hides every GPU). Never raises: a GPU that cannot be asked about is recorded as none."""
    torch = sys.modules.get("torch")
    try:
        if torch is not None and torch.cuda.is_available():
            return str(torch.cuda.get_device_name(0))
    except Exception:  # noqa: BLE001 - a broken CUDA install reads as no GPU here; the backend says why when it runs
        pass
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    smi = shutil.which("nvidia-smi")
    if smi is None or (visible is not None and not visible.strip()):
        return None
    which = [f"--id={visible.split(',')[0].strip()}"] if visible is not None else []
    try:
        done = subprocess.run([smi, "--query-gpu=name", "--format=csv,noheader", *which], capture_output=True,
                              text=True, timeout=20, check=False)  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    names = [line.strip() for line in done.stdout.splitlines() if line.strip()] if done.returncode == 0 else []
    return names[0] if names else None


def machine_kind(machine: dict[str, Any]) -> str:
    """'<CPU model> x<usable CPUs> <arch>[ + <device>]': timings compare only between machines of one kind (the
    host name does not matter); '' when not recorded (results written before qbench recorded it)."""
    if not machine.get("cpu"):
        return ""
    kind = f"{machine['cpu']} x{machine.get('cpus')} {machine.get('arch', '')}".rstrip()
    return f"{kind} + {machine['device']}" if machine.get("device") else kind
