"""The sweep's load figures when the search for the highest rate is cut short by its cost
(qbench.serving._with_load)."""

from __future__ import annotations

import math

import numpy as np
from stalled_timings import stalled_digits_samples

from qbench.recipe.spec import load_recipe
from qbench.results.schema import LatencyPoint
from qbench.results.serving import LoadStats
from qbench.serving import serving_figures
from tests.recipe.test_spec import with_changes, write_recipe


def _budget_recipe(tmp_path):
    """Timed at batch 1 and 32, a budget of 22 ms at 100 req/s behind a batcher waiting at most 1 ms."""
    return load_recipe(write_recipe(tmp_path, with_changes(
        latency={"batch_sizes": [1, 32]},
        slo={"p99_ms": 22.0, "rate_rps": 100.0, "load": {"max_queue_delay_ms": 1.0, "requests": 5000}},
    )))  # fmt: skip


def _points(samples: dict[int, np.ndarray]) -> list[LatencyPoint]:
    """The latency table of each batch size's timed samples (ms)."""
    return [LatencyPoint(bs, 0, v.size, *(float(q) for q in np.percentile(v, [50, 95, 99])), float(v.mean()),
                         bs * 1000 / float(v.mean())) for bs, v in samples.items()]  # fmt: skip


def test_a_search_cut_short_by_its_cost_does_not_skip_the_real_run_at_the_budgets_rate(tmp_path):
    """Timings with stalls (0.15 % of runs, 8-50 ms), a 22 ms budget at 100 req/s: the search stops before a round it
    cannot afford, unsettled (at 20 ms it now settles: sizes between 1 and 32 are charged their slowest rows' timings
    too). A real server meeting the budget at every rate served the simulated claim (about 606
    req/s) and so skipped the real run at 100 req/s, leaving the gate the simulation's p99 there alone; a search cut
    short stands in for no real run, so 100 req/s is served for real too."""
    recipe = _budget_recipe(tmp_path)
    samples = stalled_digits_samples()
    points = _points(samples)
    served: list[float] = []

    def server(rate: float, overhead_ms: float, budget_ms: float) -> LoadStats:
        served.append(rate)
        return LoadStats(rate, 1000, 0.5, 0.8, 1.0, 0.6, 0.1, 1.0, rate, overloaded=False)

    serving = serving_figures(recipe, "onnxruntime-cpu", samples, points, model_bytes=4000, runtime={},
                              preprocess_ms_per_row=0.0, server=server)  # fmt: skip
    assert serving.max_rate_rps is not None and serving.max_rate_rps > 100.0  # real runs met it above 100 req/s
    assert served[-1] == 100.0 and serving.served_at_rate is not None and serving.served_at_rate.rate_rps == 100.0
    assert serving.simulated_undecided and serving.simulated_requests == 80_000
    assert math.isfinite(serving.at_rate.p99_ms)


def test_a_budget_rate_run_that_cannot_tell_is_served_again_longer_and_judged_only_when_it_can(tmp_path):
    """The real run at the budget's rate cannot tell whether the server keeps up: it is served once more, SETTLE_RUNS
    runs long; what that run shows is recorded (here it can tell: the server keeps up)."""
    from qbench.validate.serve import SETTLE_RUNS

    recipe = _budget_recipe(tmp_path)
    samples = {1: np.full(200, 0.5), 32: np.full(200, 2.0)}
    points = _points(samples)
    calls: list[tuple[float, int]] = []

    def server(rate: float, overhead_ms: float, budget_ms: float, runs: int = 1) -> LoadStats:
        calls.append((rate, runs))
        undecided = "" if runs > 1 or rate > 100.0 else "12 batches of its largest sizes, expected at least 30"
        meets = rate <= 50.0  # real runs above 50 req/s miss the budget: the budget's rate is served for real
        return LoadStats(rate, 1000, 0.5, 0.8, 1.0 if meets else 30.0, 0.6, 0.1, 1.0, rate, keep_up_undecided=undecided)

    serving = serving_figures(recipe, "onnxruntime-cpu", samples, points, model_bytes=4000, runtime={},
                              preprocess_ms_per_row=0.0, server=server)  # fmt: skip
    assert calls[-2:] == [(100.0, 1), (100.0, SETTLE_RUNS)]
    assert serving.served_at_rate is not None and not serving.served_at_rate.keep_up_undecided


def test_pre_processing_on_the_cpus_a_host_backend_runs_the_model_on_lowers_the_rate_claimed(tmp_path):
    """Batch 32 in 2 ms (16,000 req/s) and 0.05 ms of pre-processing a request: on a CPU backend the pre-processing
    takes the cores the model runs on, so full batches serve at most 32 / (2 + 32 x 0.05) ms = 8,889 req/s, and the
    simulation claimed up to about 15,000 (the pre-processing was charged to each request's latency only); on a GPU
    backend the model runs on the device, and the host's pre-processing takes nothing from it."""
    recipe = _budget_recipe(tmp_path)
    samples = {1: np.full(200, 0.5), 32: np.full(200, 2.0)}
    points = _points(samples)

    def server(rate: float, overhead_ms: float, budget_ms: float, runs: int = 1) -> LoadStats:
        return LoadStats(rate, 1000, 0.5, 0.8, 1.0, 0.6, 0.1, 1.0, rate)

    claimed = {backend: serving_figures(recipe, backend, samples, points, model_bytes=4000, runtime={},
                                        preprocess_ms_per_row=0.05, server=server).simulated_max_rate_rps
               for backend in ("onnxruntime-cpu", "onnxruntime-cuda")}  # fmt: skip
    assert claimed["onnxruntime-cpu"] is not None and claimed["onnxruntime-cpu"] < 32_000 / (2.0 + 32 * 0.05)
    assert claimed["onnxruntime-cuda"] is not None and claimed["onnxruntime-cuda"] > 32_000 / (2.0 + 32 * 0.05)
