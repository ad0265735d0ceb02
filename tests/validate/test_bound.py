import pytest

from qbench.validate.bound import (
    estimate_bound,
    last_level_cache_bytes,
    lookup_table_bytes,
    memory_bandwidth_bytes_per_s,
)

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


def test_lookup_tables_a_run_reads_rows_of_are_left_out_of_the_weight_traffic():
    """A recommender's 99 MB of embedding tables beside 1 MB of MLP, at 10 ms per batch-1 run: counted whole, 10 GB/s
    (83 % of 12 GB/s: memory-bound, and a smaller precision would seem to help); a run reads only the rows it looks up,
    so 1 MB x 100 runs/s = 0.1 GB/s, inside a 32 MiB cache: not memory-bound."""
    whole = estimate_bound(100_000_000, 10.0, bandwidth_bytes_per_s=12 * GB, batched=(32, 200.0), cache_bytes=2**25)
    assert whole.verdict == "memory-bound"
    rows = estimate_bound(100_000_000, 10.0, bandwidth_bytes_per_s=12 * GB, batched=(32, 200.0), cache_bytes=2**25,
                          lookup_bytes=99_000_000)  # fmt: skip
    assert rows.weight_bytes_per_s == pytest.approx(0.1 * GB)
    assert rows.bandwidth_fraction == pytest.approx(0.1 / 12)
    assert rows.verdict == "compute-bound"  # fixed share (32 * 10 - 200) / 31 / 10 = 39 %
    assert "99 MB of lookup tables left out: a run reads only their rows" in rows.basis
    # the 100 MB model does not fit in the 32 MiB cache: the 1 MB a run reads does
    assert "(what a run reads fits in the 32 MiB cache)" in rows.basis and "the model fits" not in rows.basis


def test_the_tables_a_graph_only_looks_rows_up_in_are_counted(tmp_path):
    """torch's nn.Embedding (50 x 8 float32: 1,600 bytes) and nn.EmbeddingBag (30 x 8: 960 bytes, looked up inside a
    Loop) are tables; the Linear's weight is read whole, and so is a table a matrix product also reads (20 x 8, also
    the weight of a MatMul, as a language model's tied output layer reads its embedding)."""
    import torch

    class Recommender(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.users = torch.nn.Embedding(50, 8)
            self.items = torch.nn.EmbeddingBag(30, 8, mode="mean")
            self.tags = torch.nn.Embedding(20, 8)
            self.head = torch.nn.Linear(8, 20)

        def forward(self, user, item):
            hidden = self.head(self.users(user) * self.items(item.unsqueeze(1)) + self.tags(user % 20))
            return hidden @ self.tags.weight  # the table itself, not a folded transpose of it

    path = tmp_path / "rec.onnx"
    example = (torch.zeros(2, dtype=torch.int64), torch.zeros(2, dtype=torch.int64))
    torch.onnx.export(Recommender().eval(), example, str(path), input_names=["user", "item"], opset_version=17,
                      dynamic_axes={"user": {0: "batch"}, "item": {0: "batch"}}, dynamo=False)  # fmt: skip
    assert lookup_table_bytes(path) == 50 * 8 * 4 + 30 * 8 * 4
