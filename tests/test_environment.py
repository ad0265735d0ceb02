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
