"""Facts about the machine that change measured results: recorded with every sweep.

INT8 accuracy on x86 depends on the CPU: without VNNI, ORT's u8s8 kernels can
saturate (vpmaddubsw), so reduce_range='auto' turns on 7-bit weights there.
"""

from __future__ import annotations

import functools
import logging
import math
import os
import platform
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

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
        **cpu_allowance().as_record(),
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
    allowance = cpu_allowance()
    machine: dict[str, Any] = {"host": socket.gethostname(), "cpu": _cpu_model(), "cpus": allowance.usable,
                               "arch": platform.machine(), "affinity_cpus": allowance.affinity,
                               "cpu_quota": allowance.quota}  # fmt: skip
    if device:
        machine["device"] = device
    return machine


@dataclass(frozen=True)
class CpuAllowance:
    """The CPUs this process may compute on: its affinity mask's (taskset, a container's cpuset) and its cgroup's CPU
    quota (`quota`: CPUs' worth of time per period, None without one; Kubernetes CPU limits are such quotas). A
    runtime's thread pool larger than `usable` takes turns on the CPUs it is allowed: its latencies describe a
    smaller machine than its thread count says."""

    affinity: int
    quota: float | None = None

    @property
    def usable(self) -> int:
        """min(affinity CPUs, the quota rounded down), at least 1: under 1.5 CPUs of quota 2 busy threads use up each
        period's quota in 75 ms of its 100 and wait out the rest (CFS throttling), so 1 thread is what runs
        unthrottled; below 1 CPU of quota even one is throttled (`qbench.validate.contention.oversubscribed`)."""
        return self.affinity if self.quota is None else max(1, min(self.affinity, math.floor(self.quota)))

    def as_record(self) -> dict[str, Any]:
        """What results record of it (`usable_cpus`, `affinity_cpus`, `cpu_quota`: None without a quota)."""
        return {"usable_cpus": self.usable, "affinity_cpus": self.affinity, "cpu_quota": self.quota}


def cpu_allowance(root: Path = Path("/")) -> CpuAllowance:
    """This process's CPU allowance: its affinity mask's CPUs (os.cpu_count() where the platform has none) and the
    cgroup quota read under `root` (`cpu_quota`). Read on every call: a container's limits can change under it."""
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return CpuAllowance(affinity, cpu_quota(root))


def default_threads() -> int:
    """Intra-op threads when the recipe leaves `latency.threads` unset: the usable CPUs, at most the physical cores
    (ONNX Runtime's own default counts the host's physical cores, blind to affinity and quotas; torch's counts the
    affinity mask's, blind to quotas)."""
    import psutil

    physical = psutil.cpu_count(logical=False)
    usable = cpu_allowance().usable
    return min(usable, physical) if physical else usable


def timed_threads(threads: int | None) -> int:
    """The intra-op threads a runtime runs with for `latency.threads` (None: `default_threads`)."""
    return threads if threads is not None else default_threads()


def cpu_quota(root: Path = Path("/")) -> float | None:
    """CPUs' worth of time this process's cgroup may use per period, None without a quota: the smallest quota of its
    cgroup and the cgroups above it (a parent's quota limits its children), cgroup v2 (`cpu.max`: "150000 100000"
    is 1.5 CPUs, "max 100000" none) and v1 (`cpu.cfs_quota_us` / `cpu.cfs_period_us`, -1: none). The process's
    cgroup comes from `root`/proc/self/cgroup, where its hierarchies are mounted from `root`/proc/self/mountinfo
    (else their usual places under /sys/fs/cgroup); absent or unreadable files mean no quota."""
    quotas = [_quota_in(directory) for directory in _cpu_cgroup_dirs(root)]
    return min((quota for quota in quotas if quota is not None), default=None)


_V1_MOUNTS = ("sys/fs/cgroup/cpu,cpuacct", "sys/fs/cgroup/cpu")


def _cpu_cgroup_dirs(root: Path) -> list[Path]:
    """The directories of this process's CPU cgroups (v2 and v1) and of every cgroup above them, up to the mount."""
    membership = _read(root / "proc/self/cgroup")
    if membership is None:
        return []
    mounts = _cgroup_mounts(root)
    directories: list[Path] = []
    for line in membership.splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        version = "v2" if hierarchy == "0" and not controllers else "v1" if "cpu" in controllers.split(",") else None
        for mount_root, mount_point in mounts.get(version, []) if version else []:
            relative = path[len(mount_root):] if path.startswith(mount_root) else ""  # another namespace: the mount's
            directory = mount_point / relative.strip("/")
            directories += [directory, *[d for d in directory.parents if d.is_relative_to(mount_point)]]
    return directories


def _cgroup_mounts(root: Path) -> dict[str, list[tuple[str, Path]]]:
    """'v2' / 'v1' (the hierarchy holding the cpu controller) -> (the cgroup mounted, where), from mountinfo."""
    info = _read(root / "proc/self/mountinfo")
    if info is None:
        return {"v2": [("/", root / "sys/fs/cgroup")], "v1": [("/", root / place) for place in _V1_MOUNTS]}
    mounts: dict[str, list[tuple[str, Path]]] = {"v2": [], "v1": []}
    for line in info.splitlines():
        fields, _, after = line.partition(" - ")
        head, tail = fields.split(), after.split()
        if len(head) < 5 or len(tail) < 3:
            continue
        cpu_v1 = tail[0] == "cgroup" and "cpu" in tail[2].split(",")
        version = "v2" if tail[0] == "cgroup2" else "v1" if cpu_v1 else None
        if version:
            mounts[version].append((head[3], root / head[4].lstrip("/")))
    return mounts


def _quota_in(directory: Path) -> float | None:
    """The CPU quota set on one cgroup directory (v2 cpu.max or v1 cfs files), None where none is."""
    v2 = _read(directory / "cpu.max")
    if v2 is not None:
        quota, _, period = v2.strip().partition(" ")
        return _ratio(quota, period or "100000", directory / "cpu.max")
    quota = _read(directory / "cpu.cfs_quota_us")
    period = _read(directory / "cpu.cfs_period_us")
    return _ratio(quota.strip(), period.strip(), directory / "cpu.cfs_quota_us") if quota and period else None


def _ratio(quota: str, period: str, source: Path) -> float | None:
    if quota in ("max", "-1"):
        return None
    try:
        value, length = int(quota), int(period)
    except ValueError:
        logger.debug("%s: unreadable CPU quota %r / %r, taken as none", source, quota, period)
        return None
    return value / length if value > 0 and length > 0 else None


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def package_versions(packages: Iterable[str]) -> dict[str, str]:
    """Each distribution's installed version ("absent" where it is not installed): the package facts of a build's key
    and of a measurement's record."""
    return {name: package_version(name) or "absent" for name in packages}


def measurement_facts(packages: Iterable[str], threads: int | None, gpu: bool = False) -> dict[str, str]:
    """What a measurement's figures depend on beyond its model and the recipe, here: the installed versions of the
    `packages` that computed them, and the machine facts latency depends on (CPU model, usable CPUs, the cgroup's CPU
    quota, which usable CPUs round down: 1 and 1.5 CPUs of quota are both 1 usable, architecture, the threads timed:
    `timed_threads`, the usable CPUs' default when none are asked for; with `gpu`, a backend computing on a GPU, the
    GPU's model, "none" without one). A resumed sweep reuses a measurement only where
    they are today's (qbench.execute.resume), so one table never mixes runtimes or machines. A CPU backend's facts
    leave the GPU out: another GPU in the machine does not change what it measures."""
    allowance = cpu_allowance()
    facts = {**package_versions(packages), "cpu": _cpu_model(), "cpus": str(allowance.usable),
             "cpu_quota": str(allowance.quota) if allowance.quota is not None else "none",
             "machine": platform.machine(), "threads": str(timed_threads(threads))}  # fmt: skip
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


def recorded_quota(machine: dict[str, Any]) -> float | None:
    """The cgroup CPU quota a timing machine recorded (CPUs per period), None without one."""
    quota = machine.get("cpu_quota")
    return float(quota) if isinstance(quota, (int, float)) and not isinstance(quota, bool) else None


def binding_quota(machine: dict[str, Any]) -> float | None:
    """The recorded quota where it binds: below the CPUs the affinity mask allows (a quota above them caps nothing)."""
    quota = recorded_quota(machine)
    return quota if quota is not None and quota < machine.get("affinity_cpus", math.inf) else None


def machine_kind(machine: dict[str, Any]) -> str:
    """'<CPU model> x<usable CPUs>[ quota <CPUs>] <arch>[ + <device>]': timings compare only between machines of one
    kind (the host name does not matter); '' when not recorded (results written before qbench recorded it). The cgroup
    CPU quota is part of it where it binds (below the affinity CPUs): a quota caps the CPU time of everything in the
    cgroup, each period, where an affinity mask only says where it runs, and 1 and 1.5 CPUs of quota both leave 1
    usable CPU; a quota above the CPUs the process may run on caps nothing."""
    if not machine.get("cpu"):
        return ""
    quota = binding_quota(machine)
    limit = f" quota {quota:g}" if quota is not None else ""
    kind = f"{machine['cpu']} x{machine.get('cpus')}{limit} {machine.get('arch', '')}".rstrip()
    return f"{kind} + {machine['device']}" if machine.get("device") else kind


def available_memory() -> int | None:
    """Bytes of memory available to a new allocation now (Linux MemAvailable, else free pages); None if unknown."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None
