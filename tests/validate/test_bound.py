import pytest

from qbench.validate.bound import estimate_bound, last_level_cache_bytes, memory_bandwidth_bytes_per_s

GB = 1e9


def test_streaming_weights_at_most_of_the_bandwidth_is_memory_bound():
    # 100 MB of weights every 10 ms = 10 GB/s, against 12 GB/s: 83 %
    estimate = estimate_bound(100_000_000, 10.0, bandwidth_bytes_per_s=12 * GB, batched=(32, 200.0))
    assert estimate.verdict == "memory-bound"
    assert estimate.weight_bytes_per_s == pytest.approx(10 * GB)
    assert estimate.bandwidth_fraction == pytest.approx(10 / 12)


def test_a_model_inside_the_cache_is_never_memory_bound():
    estimate = estimate_bound(1_000_000, 0.1, bandwidth_bytes_per_s=12 * GB, batched=(32, 3.0), cache_bytes=2**25)
    assert estimate.bandwidth_fraction == pytest.approx(10 / 12)
    assert estimate.verdict == "compute-bound"  # fixed share (32 * 0.1 - 3.0) / 31 / 0.1 = 6.5 %
    assert "fits in the 32 MiB cache" in estimate.basis


def test_overhead_and_compute_from_the_batch_scaling():
    # t(1) = 1 ms, t(32) = 1.5 ms: fixed per call (32 - 1.5) / 31 = 0.984 ms, 98 % of batch 1
    overhead = estimate_bound(1_000, 1.0, bandwidth_bytes_per_s=10 * GB, batched=(32, 1.5))
    assert overhead.verdict == "overhead-bound" and "98%" in overhead.basis
    compute = estimate_bound(1_000, 1.0, bandwidth_bytes_per_s=10 * GB, batched=(32, 30.0))
    assert compute.verdict == "compute-bound"


def test_an_idle_gpu_means_overhead_and_missing_figures_unknown():
    assert estimate_bound(1_000, 1.0, bandwidth_bytes_per_s=GB, gpu_util_pct=20.0).verdict == "overhead-bound"
    assert estimate_bound(None, 1.0, bandwidth_bytes_per_s=GB).verdict == "unknown"


def test_bandwidth_is_measured_once(tmp_path):
    first = memory_bandwidth_bytes_per_s()
    assert first > 1e8  # any machine copies more than 100 MB/s
    assert memory_bandwidth_bytes_per_s() is first or memory_bandwidth_bytes_per_s() == first
    (tmp_path / "index0").mkdir()
    (tmp_path / "index0" / "size").write_text("48K\n")
    (tmp_path / "index3").mkdir()
    (tmp_path / "index3" / "size").write_text("32768K\n")
    assert last_level_cache_bytes(tmp_path) == 32 * 2**20
