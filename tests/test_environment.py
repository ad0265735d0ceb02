from importlib import metadata

from qbench import environment
from qbench.environment import describe_environment, package_version


def test_package_version_is_the_installed_distribution_or_none():
    assert package_version("numpy") == metadata.version("numpy")
    assert package_version("no-such-distribution-qbench-test") is None


def test_package_versions_are_read_once_per_process(monkeypatch):
    """A lookup scans sys.path: the sweep asks for the same versions once per build and per results file."""
    package_version.cache_clear()
    calls = []

    def counting(name):
        calls.append(name)
        return "1.2.3"

    monkeypatch.setattr(environment.metadata, "version", counting)
    try:
        first = describe_environment()["packages"]
        second = describe_environment()["packages"]
    finally:
        package_version.cache_clear()
    assert first == second and set(first.values()) == {"1.2.3"}
    assert sorted(calls) == sorted(set(calls))  # each distribution looked up once


def test_the_gpu_model_comes_from_torch_when_imported_and_otherwise_from_nvidia_smi_without_importing_torch(
        monkeypatch, tmp_path):  # fmt: skip
    """The model a GPU backend's measurement records (qbench.environment.gpu_model): torch's name when torch is
    already imported and sees CUDA, else nvidia-smi's for the first device CUDA_VISIBLE_DEVICES leaves visible,
    without importing torch; None without nvidia-smi or with every device hidden."""
    import sys
    from types import SimpleNamespace

    cuda = SimpleNamespace(is_available=lambda: True, get_device_name=lambda index: f"Torch GPU {index}")
    monkeypatch.setitem(sys.modules, "torch", SimpleNamespace(cuda=cuda))
    environment.gpu_model.cache_clear()
    assert environment.gpu_model() == "Torch GPU 0"

    monkeypatch.delitem(sys.modules, "torch")
    smi = tmp_path / "nvidia-smi"
    smi.write_text(f'#!/bin/sh\necho "$@" > {tmp_path / "args"}\nprintf "NVIDIA H100 80GB HBM3\\nNVIDIA L4\\n"\n')
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,1")
    environment.gpu_model.cache_clear()
    assert environment.gpu_model() == "NVIDIA H100 80GB HBM3" and "torch" not in sys.modules
    assert "--id=3" in (tmp_path / "args").read_text()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    environment.gpu_model.cache_clear()
    assert environment.gpu_model() is None
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    environment.gpu_model.cache_clear()
    assert environment.gpu_model() is None
    environment.gpu_model.cache_clear()


def _cgroup_root(tmp_path, membership: str, files: dict[str, str], mountinfo: str | None = None):
    """A fake filesystem root: /proc/self/cgroup (and mountinfo) and cgroup files, as a container sees them."""
    from pathlib import Path

    root = Path(tmp_path)
    (root / "proc/self").mkdir(parents=True)
    (root / "proc/self/cgroup").write_text(membership)
    if mountinfo is not None:
        (root / "proc/self/mountinfo").write_text(mountinfo)
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


POD = "sys/fs/cgroup/kubepods/pod1"


def test_the_cgroup_v2_quota_is_the_smallest_of_the_process_s_cgroup_and_those_above(tmp_path):
    """cpu.max "150000 100000" is 1.5 CPUs (1 usable: 2 busy threads use it up 75 ms into each 100 ms period and
    wait out the rest), "max 100000" none; a parent's lower quota limits the child's (a Kubernetes pod's limit over
    its container's)."""
    from qbench.environment import CpuAllowance, cpu_quota

    unlimited = _cgroup_root(tmp_path / "max", "0::/kubepods/pod1\n", {f"{POD}/cpu.max": "max 100000\n"})
    assert cpu_quota(unlimited) is None
    limited = _cgroup_root(tmp_path / "limit", "0::/kubepods/pod1\n", {f"{POD}/cpu.max": "150000 100000\n"})
    assert cpu_quota(limited) == 1.5
    assert CpuAllowance(8, 1.5).usable == 1 and CpuAllowance(8, 2.0).usable == 2 and CpuAllowance(8, None).usable == 8
    assert CpuAllowance(8, 2.9).usable == 2 and CpuAllowance(1, 1.5).usable == 1
    assert CpuAllowance(4, 0.25).usable == 1  # a quarter of a CPU still runs one thread
    parent = _cgroup_root(tmp_path / "parent", "0::/kubepods/pod1\n",
                          {f"{POD}/cpu.max": "max 100000\n", "sys/fs/cgroup/kubepods/cpu.max": "50000 100000\n"})
    assert cpu_quota(parent) == 0.5


def test_the_cgroup_v1_quota_follows_mountinfo_and_missing_files_are_no_quota(tmp_path):
    """cgroup v1: cpu.cfs_quota_us / cpu.cfs_period_us of the hierarchy holding the cpu controller, found where
    mountinfo mounts it (Docker mounts the container's own cgroup, /docker/<id>, at /sys/fs/cgroup/cpu,cpuacct);
    -1 is no quota, and a host without cgroup files has none."""
    from qbench.environment import cpu_quota

    mountinfo = ("31 23 0:28 / /sys/fs/cgroup ro - tmpfs tmpfs ro\n"
                 "32 31 0:29 /docker/abc /sys/fs/cgroup/cpu,cpuacct ro,relatime - cgroup cgroup rw,cpu,cpuacct\n"
                 "33 31 0:30 /docker/abc /sys/fs/cgroup/memory ro,relatime - cgroup cgroup rw,memory\n")  # fmt: skip
    membership = "5:memory:/docker/abc\n4:cpu,cpuacct:/docker/abc\n0::/\n"
    quota = {"sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us": "200000\n",
             "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us": "100000\n",
             "sys/fs/cgroup/memory/cpu.cfs_quota_us": "100000\n"}  # not the cpu hierarchy: not read  # fmt: skip
    assert cpu_quota(_cgroup_root(tmp_path / "v1", membership, quota, mountinfo)) == 2.0
    none = {**quota, "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us": "-1\n"}
    assert cpu_quota(_cgroup_root(tmp_path / "v1none", membership, none, mountinfo)) is None
    assert cpu_quota(_cgroup_root(tmp_path / "bare", "0::/\n", {})) is None
    assert cpu_quota(tmp_path / "nothing") is None  # not even /proc/self/cgroup


def test_unset_threads_default_to_the_usable_cpus_and_machine_records_the_allowance(monkeypatch):
    """With `latency.threads` unset a runtime gets the usable CPUs (at most the physical cores), not its own default
    (ONNX Runtime counts the host's physical cores whatever the quota); the timing machine records the allowance."""
    import psutil

    from qbench.environment import CpuAllowance, default_threads, machine_kind, timed_threads, timing_machine

    monkeypatch.setattr(environment, "cpu_allowance", lambda root=None: CpuAllowance(8, 2.5))
    monkeypatch.setattr(psutil, "cpu_count", lambda logical=True: 8 if logical else 4)
    assert default_threads() == 2 and timed_threads(None) == 2 and timed_threads(6) == 6
    monkeypatch.setattr(environment, "cpu_allowance", lambda root=None: CpuAllowance(8, 1.5))
    assert default_threads() == 1  # 1.5 CPUs of quota: 2 threads would be throttled each period
    monkeypatch.setattr(environment, "cpu_allowance", lambda root=None: CpuAllowance(8, None))
    assert default_threads() == 4  # no quota: the physical cores, as the runtimes choose
    monkeypatch.setattr(environment, "cpu_allowance", lambda root=None: CpuAllowance(8, 1.5))
    machine = timing_machine()
    assert (machine["cpus"], machine["affinity_cpus"], machine["cpu_quota"]) == (1, 8, 1.5)
    assert " x1 quota 1.5 " in machine_kind(machine)  # a 1.5-CPU pod times unlike the 8-CPU host
    recorded = describe_environment()  # results' environment
    assert (recorded["usable_cpus"], recorded["affinity_cpus"], recorded["cpu_quota"]) == (1, 8, 1.5)


def test_the_cgroup_quota_is_part_of_the_machine_kind():
    """Two nodes of one CPU model with 2 usable CPUs each, one a 2-CPU pod on a 16-CPU node, one a 2-CPU machine
    without a quota, and a 1- and a 1.5-CPU pod (1 usable CPU each), are four kinds; results written before the quota
    was recorded keep their kind."""
    from qbench.environment import machine_kind

    node = {"host": "a", "cpu": "Intel Xeon", "cpus": 2, "arch": "x86_64", "affinity_cpus": 2, "cpu_quota": None}
    pod = {**node, "host": "b", "affinity_cpus": 16, "cpu_quota": 2.0}
    assert machine_kind(node) == "Intel Xeon x2 x86_64"
    assert machine_kind(pod) == "Intel Xeon x2 quota 2 x86_64"
    one, one_and_a_half = {**pod, "cpus": 1, "cpu_quota": 1.0}, {**pod, "cpus": 1, "cpu_quota": 1.5}
    assert machine_kind(one) == "Intel Xeon x1 quota 1 x86_64" != machine_kind(one_and_a_half)
    assert machine_kind({"cpu": "Intel Xeon", "cpus": 2, "arch": "x86_64"}) == "Intel Xeon x2 x86_64"
    assert machine_kind({**pod, "device": "NVIDIA H100"}) == "Intel Xeon x2 quota 2 x86_64 + NVIDIA H100"
    # a quota of 16 CPUs on a pod pinned to 2 caps nothing: the same kind as the machine without one
    assert machine_kind({**node, "cpu_quota": 16.0}) == machine_kind(node)
