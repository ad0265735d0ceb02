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
