"""The real in-process server the simulated highest rate is checked against, and the step-down search."""

from __future__ import annotations

import time

import numpy as np
import pytest

from qbench.results.schema import LatencyPoint
from qbench.results.serving import LoadStats
from qbench.validate.keep_up import MIN_BATCHES
from qbench.validate.load import Batcher
from qbench.validate.serve import (
    FIRST_CLAIM_RUNS,
    MAX_RUNS,
    MAX_SECONDS,
    SETTLE_RUNS,
    STEP,
    real_server,
    serve,
    served_max_rate,
    served_stats,
    settling_runs,
)

SLEEP_MS = 2.0  # the sleeping runner's own cost per call, whatever the batch


class SleepingRunner:
    """A backend whose per-call overhead is large by construction: every run sleeps SLEEP_MS (its timed runs, taken
    apart from any server, are what the test says they are)."""

    def __init__(self) -> None:
        self.calls = 0

    def run(self, feeds):
        self.calls += 1
        time.sleep(SLEEP_MS / 1000)
        return [feeds["x"]]

    def describe(self):
        return {}

    def close(self) -> None:
        pass


ROWS = {"x": np.arange(64, dtype=np.float32).reshape(64, 1)}


def test_a_server_that_falls_behind_is_overloaded_even_when_the_short_run_meets_the_budget():
    """400 requests at 5,000 req/s onto one call of 2 ms per request: about 0.7 s of backlog by the end. The p99
    is within a 10 s budget, but the server completed at its capacity (~500 req/s): overloaded, never a pass."""
    arrivals = np.cumsum(np.random.default_rng(0).exponential(1000 / 5000, size=400))
    served = serve(SleepingRunner(), ROWS, arrivals, Batcher(1, 0.0))
    stats = served_stats(served, 5000.0)
    assert stats.p99_ms < 10_000
    assert stats.overloaded
    assert stats.achieved_rps < 1000 / SLEEP_MS


def test_the_served_rate_steps_down_from_the_simulated_one_until_a_real_run_meets_the_budget():
    """A server meeting the budget only up to 1,000 req/s: the rate claimed is at most that, within 10 % of it (stepped
    down, then bisected), and never above the simulated rate it started from; none is claimed when no run within
    MAX_RUNS passes."""

    def server(rate, overhead_ms, budget_ms):
        return LoadStats(rate, 500, 1.0, 2.0, 5.0 if rate <= 1000 else 50.0, 1.0, 0.1, 1.0, rate, overloaded=False)

    found = served_max_rate(server, 5000.0, budget_ms=10.0)
    assert 0.9 * 1000 <= found.max_rate_rps <= 1000
    assert found.at_max.p99_ms <= 10.0 and found.runs > 1
    assert served_max_rate(server, 800.0, budget_ms=10.0).max_rate_rps == 800.0  # the simulation's own answer held
    never = served_max_rate(lambda rate, overhead_ms, budget_ms: server(1e9, overhead_ms, budget_ms), 5000.0,
                            budget_ms=10.0)  # fmt: skip
    assert never.max_rate_rps is None and never.at_max is None and never.runs <= MAX_RUNS


def _slow_server(capacity_rps: float, tried: list[float]):
    """A synthetic server within a 250 ms budget at rates up to `capacity_rps` and far past it above, recording the
    rates it was run at; its runs hold MIN_REQUESTS whatever the rate, seconds of arrivals each near 40 req/s."""

    def server(rate, overhead_ms, budget_ms):
        tried.append(rate)
        return LoadStats(rate, 200, 30.0, 50.0, 65.9 if rate <= capacity_rps else 900.0, 35.0, 5.0, 1.0, rate)

    return server


def test_a_slow_model_missing_the_simulated_rate_gets_its_step_down_and_the_run_confirming_it():
    """Simulated 39.6 req/s, met for real up to 35: the run at 39.6 misses (5.1 s of arrivals), the step down to 31.7
    (6.3 s) and its confirmation pass MAX_SECONDS together, yet a search that has claimed nothing makes them: 31.7 is
    claimed (before: the run at 39.6 alone, no rate claimed)."""
    tried: list[float] = []
    found = served_max_rate(_slow_server(35.0, tried), 39.6, budget_ms=250.0)
    assert tried == [39.6, pytest.approx(STEP * 39.6), pytest.approx(STEP * 39.6)]
    assert found.max_rate_rps == pytest.approx(STEP * 39.6) and found.runs == 3
    assert sum(200 / rate for rate in tried) > MAX_SECONDS  # past the seconds' bound, within the first claim's runs


def test_the_first_claims_runs_are_bounded_and_a_pass_there_is_still_confirmed_before_it_is_claimed():
    """Met only up to 21 req/s: 39.6, 31.7, 25.3 miss and 20.3 passes as the FIRST_CLAIM_RUNS-th run, with no run left
    to confirm it (and MAX_SECONDS spent): nothing is claimed on one run, and no further run is made."""
    tried: list[float] = []
    found = served_max_rate(_slow_server(21.0, tried), 39.6, budget_ms=250.0)
    assert len(tried) == FIRST_CLAIM_RUNS and tried[-1] == pytest.approx(STEP**3 * 39.6)
    assert found.max_rate_rps is None and found.runs == FIRST_CLAIM_RUNS


def test_a_rate_is_claimed_only_when_a_second_run_at_it_meets_the_budget_too():
    """A server whose every other run at 1,000 req/s stalls past the budget: 1,000 is never claimed."""
    calls = []

    def server(rate, overhead_ms, budget_ms):
        calls.append(rate)
        stalled = rate >= 1000 and len(calls) % 2 == 0
        return LoadStats(rate, 500, 1.0, 2.0, 50.0 if stalled or rate > 1000 else 5.0, 1.0, 0.1, 1.0, rate)

    found = served_max_rate(server, 1000.0, budget_ms=10.0)
    assert found.max_rate_rps < 1000.0 and found.at_max.p99_ms <= 10.0


def test_an_overloaded_run_jumps_below_the_rate_the_server_managed():
    """A simulation 100x optimistic is not stepped down 0.8 at a time: the next rate is below what was served."""
    tried = []

    def server(rate, overhead_ms, budget_ms):
        tried.append(rate)
        served = min(rate, 1000.0)
        return LoadStats(rate, 500, 1.0, 2.0, 5.0, 1.0, 0.1, 1.0, served, overloaded=rate > 1000.0)

    found = served_max_rate(server, 100_000.0, budget_ms=10.0)
    assert tried[:3] == [100_000.0, pytest.approx(STEP * 1000.0), pytest.approx(STEP * 1000.0)]  # and confirmed
    assert 0.95 * 1000.0 <= found.max_rate_rps <= 1000.0  # then bisected up to the lowest rate that failed


def test_a_backend_with_a_large_per_call_cost_gets_no_rate_above_what_it_serves(tmp_path):
    """Timed runs of 0.02-0.05 ms (the model's own time, as a backend times it) make the simulation promise far
    more than a runner that takes SLEEP_MS per call can serve: 8 rows per call at most, 4,000 req/s. The rate
    reported comes from real runs, is at most that, and its real p99 met the budget; the simulation's is kept apart."""
    from qbench.recipe.spec import load_recipe
    from qbench.serving import server_for, serving_figures
    from tests.recipe.test_spec import with_changes, write_recipe

    # a budget far above the runner's 2 ms: the rate is capped by what the server serves, not by how late a loaded
    # machine wakes a sleeping runner (a 20 ms budget met no real run there: no rate was claimed at all)
    recipe = load_recipe(write_recipe(tmp_path, with_changes(
        latency={"batch_sizes": [1, 8]}, cost={"price_per_hour": {"onnxruntime-cpu": 3.6}},
        slo={"p99_ms": 500.0, "rate_rps": 100.0, "load": {"max_queue_delay_ms": 1.0, "requests": 2000}},
    )))  # fmt: skip
    samples = {1: np.full(200, 0.02), 8: np.full(200, 0.05)}
    points = [LatencyPoint(1, 0, 200, 0.02, 0.02, 0.02, 0.02, 50_000.0),
              LatencyPoint(8, 0, 200, 0.05, 0.05, 0.05, 0.05, 160_000.0)]  # fmt: skip
    runner = SleepingRunner()
    server = server_for(recipe.slo, "onnxruntime-cpu", [1, 8], runner, ROWS)
    serving = serving_figures(recipe, "onnxruntime-cpu", samples, points, model_bytes=4000, runtime={},
                              preprocess_ms_per_row=0.0, server=server)  # fmt: skip
    capacity = 8 * 1000 / SLEEP_MS
    assert serving.simulated_max_rate_rps > 10 * capacity  # what the simulation alone claims
    assert serving.simulated_requests >= 2000 and serving.simulations > 0  # the requests that showed it
    assert serving.max_rate_rps is not None and serving.max_rate_rps <= capacity
    assert serving.at_max_rate.p99_ms <= 500.0 and not serving.at_max_rate.overloaded
    assert serving.served_runs >= 2 and runner.calls > 0
    assert serving.usd_per_million["max_rate"] == pytest.approx(1000.0 / serving.max_rate_rps)


def test_a_run_falling_behind_is_given_up_once_more_than_1_percent_are_late():
    """At 50x what the runner serves, a run of 20,000 requests is given up within about a second (draining it would
    take 20 s): it is overloaded, its p99 (a lower bound, from when it was given up) is past the budget and finite,
    and what it served tells the rate it managed."""
    runner = SleepingRunner()
    stats = real_server(runner, ROWS, Batcher(1, 0.0), seed=0)(25_000.0, 0.0, 20.0)
    # given up, not drained: a call per request served, far fewer than the run's (counted, not timed: a loaded
    # machine's slower sleeps only serve fewer before the run is given up)
    assert stats.requests > 1_000 and runner.calls < stats.requests // 4
    assert 20.0 < stats.p99_ms < np.inf and stats.overloaded
    assert stats.achieved_rps < 1000 / SLEEP_MS


def test_the_server_passes_the_runners_failure_on():
    class Failing(SleepingRunner):
        def run(self, feeds):
            raise RuntimeError("session lost")

    with pytest.raises(RuntimeError, match="session lost"):
        real_server(Failing(), ROWS, Batcher(4, 1.0), seed=0)(100.0, 0.0, 20.0)


def test_a_model_with_a_fixed_batch_is_served_whole_batches_filled_with_repeated_rows():
    """A model exported with its batch fixed at 4 refuses any other row count (as an ONNX Runtime session does).
    Poisson requests at 200 req/s through a batcher of up to 4 waiting 1 ms: each batch of requests is sent filled up
    to 4 rows by repeating its requests' rows, and every request is served. How many requests a batch holds is the
    machine's doing (a loaded one falls behind and batches more), so every batch is checked, whatever its size."""
    seen = []

    class FixedBatch(SleepingRunner):
        def run(self, feeds):
            rows = len(feeds["x"])
            if rows != 4:
                raise RuntimeError(f"Got invalid dimensions for input: x, index 0 Got: {rows} Expected: 4")
            seen.append(feeds["x"][:, 0].copy())
            return [feeds["x"]]

    stats = real_server(FixedBatch(), ROWS, Batcher(4, 1.0), seed=0, fixed_batch=4)(200.0, 0.0, 1000.0)
    assert stats.requests == 200 and 1.0 <= stats.mean_batch_size <= 4.0
    for batch in seen:  # its k requests' rows (consecutive, so distinct: rows repeat every 64 requests), then again
        requests = len(set(batch.tolist()))
        assert batch.tolist() == np.resize(batch[:requests], 4).tolist(), batch
    assert sum(len(set(batch.tolist())) for batch in seen) == 200  # each request's own row once


class RecordingRunner(SleepingRunner):
    """A SleepingRunner that keeps the rows it was given (the values of `x`)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[float] = set()

    def run(self, feeds):
        self.seen.update(feeds["x"][:, 0].tolist())
        return [feeds["x"]]


def test_the_real_server_serves_the_rows_the_timed_batches_hold_not_one_batch_of_them(tmp_path):
    """64 rows, batches of up to 8: the simulation draws from timed batches over every row, so the real server's
    requests are those rows too (it served the 8 of the first batch only: a slice of slow rows outside them was never
    served for real, and the server's own work was never seen together with theirs)."""
    from qbench.recipe.spec import load_recipe
    from qbench.serving import server_for
    from tests.recipe.test_spec import with_changes, write_recipe

    recipe = load_recipe(write_recipe(tmp_path, with_changes(
        latency={"batch_sizes": [1, 8]}, slo={"p99_ms": 1000.0, "rate_rps": 100.0, "load": {"max_queue_delay_ms": 1.0}},
    )))  # fmt: skip
    runner = RecordingRunner()
    server_for(recipe.slo, "onnxruntime-cpu", [1, 8], runner, ROWS)(2_000.0, 0.0, 1000.0)  # 500 requests
    assert runner.seen == set(ROWS["x"][:, 0].tolist())


class PaddedRecordingRunner:
    """Records each row it is served (its id, the first token) and the batch's width against its longest row."""

    def __init__(self, lengths) -> None:
        self.lengths = lengths
        self.seen: set[int] = set()
        self.widths: list[tuple[int, int]] = []  # (the width run, the longest row's length in the batch)

    def run(self, feeds):
        ids = feeds["input_ids"][:, 0].tolist()
        self.seen.update(ids)
        self.widths.append((feeds["input_ids"].shape[1], max(self.lengths[i] for i in ids)))
        return [feeds["input_ids"]]


def test_a_padded_text_model_is_served_every_timed_row_each_batch_at_its_own_longest_row(tmp_path):
    """64 texts of 1-16 tokens padded `longest` (to 16), batches of up to 8: the real server's requests are every row
    the timed batches hold, and each batch runs at its own longest row, as a server padding each batch runs it and as
    the batches were timed (it served the 8 rows of the first timed batch only, at that batch's one length: a mix of
    short queries and long documents was served as one length, never as its traffic)."""
    from qbench.data.text import Padding
    from qbench.recipe.spec import load_recipe
    from qbench.serving import server_for
    from tests.recipe.test_spec import with_changes, write_recipe

    lengths = [1 + (i * 7) % 16 for i in range(64)]
    ids = np.zeros((64, 16), dtype=np.int64)
    for i, length in enumerate(lengths):
        ids[i, :length] = 5
        ids[i, 0] = i  # the row's id, read back by the runner
    feeds = {"input_ids": ids, "attention_mask": (np.arange(16) < np.array(lengths)[:, None]).astype(np.int64)}
    recipe = load_recipe(write_recipe(tmp_path, with_changes(
        latency={"batch_sizes": [1, 8]}, slo={"p99_ms": 1000.0, "rate_rps": 100.0, "load": {"max_queue_delay_ms": 1.0}},
    )))  # fmt: skip
    runner = PaddedRecordingRunner(lengths)
    padding = Padding("attention_mask", ("input_ids", "attention_mask"))
    server_for(recipe.slo, "onnxruntime-cpu", [1, 8], runner, feeds, padding)(2_000.0, 0.0, 1000.0)  # 500 requests
    assert runner.seen == set(range(64))
    assert all(width == longest for width, longest in runner.widths)
    assert {width for width, _ in runner.widths} != {16}  # not every batch at the set's length


def test_two_real_runs_at_a_rate_are_two_samples_fresh_arrivals_and_the_rows_after_the_last_run(monkeypatch):
    """The search passes a rate only when two runs both meet the budget: each replayed the same seeded arrivals onto
    the same first rows (at 100 req/s, 200 requests: rows 0-199 of 1,000 every time), so the second saw only the
    machine's noise again and the rows past the first 200 were never served. Now run n draws from (seed, n) and
    starts at the row after the last one served."""
    import qbench.validate.serve as serve_module

    arrivals: list[np.ndarray] = []
    real_serve = serve_module.serve

    def recording_serve(runner, rows, arrivals_ms, *args, **kwargs):
        arrivals.append(arrivals_ms)
        return real_serve(runner, rows, arrivals_ms, *args, **kwargs)

    monkeypatch.setattr(serve_module, "serve", recording_serve)
    monkeypatch.setattr(serve_module, "RUN_SECONDS", 0.01)  # 200 requests (MIN_REQUESTS) at 2,000 req/s: 0.1 s a run
    rows = {"x": np.arange(1000, dtype=np.float32).reshape(1000, 1)}
    firsts, seconds = RecordingRunner(), RecordingRunner()
    real_server(firsts, rows, Batcher(8, 1.0), seed=0)(2_000.0, 0.0, 1000.0)
    server = real_server(seconds, rows, Batcher(8, 1.0), seed=0)
    server(2_000.0, 0.0, 1000.0)
    seconds.seen.clear()
    server(2_000.0, 0.0, 1000.0)
    assert firsts.seen == set(range(200))
    assert seconds.seen == set(range(200, 400))
    assert not np.array_equal(arrivals[1], arrivals[2])  # the same server's two runs
    assert np.array_equal(arrivals[0], arrivals[1])  # reproducible from the seed


def test_each_batchs_work_holds_its_run_and_leaves_out_the_batchers_waits():
    """The work keep_up bounds the capacity with, per batch: from taking it to taking the next, less the waits for
    requests; so at least the batch's assembly and run, and the first batch (on an empty queue) follows a wait."""
    arrivals = np.cumsum(np.random.default_rng(0).exponential(1000 / 200, size=100))
    served = serve(SleepingRunner(), ROWS, arrivals, Batcher(4, 1.0))
    assert served.work_ms.size == served.batch_sizes.size == served.idle_before.size
    assert np.all(served.work_ms >= served.run_ms + served.assembly_ms)
    assert served.idle_before[0] and served.max_batch_size == 4


def test_a_run_that_cannot_tell_whether_the_server_keeps_up_is_no_pass_and_the_search_steps_down():
    """A server within budget everywhere whose runs above 1,000 req/s cannot tell whether it keeps up: none of them is
    claimed (the 95 % rule passed them), the search steps down to where its runs can tell."""

    def server(rate, overhead_ms, budget_ms):
        undecided = "capacity 950 req/s to unbounded at 99%, not above the rate" if rate > 1000 else ""
        return LoadStats(rate, 500, 1.0, 2.0, 5.0, 1.0, 0.1, 1.0, rate, keep_up_undecided=undecided)

    found = served_max_rate(server, 5000.0, budget_ms=10.0)
    assert found.max_rate_rps is not None and 0.9 * 1000 <= found.max_rate_rps <= 1000
    assert not found.at_max.keep_up_undecided


def test_a_settling_run_is_several_runs_long_within_max_seconds_of_arrivals(monkeypatch):
    """runs=4 at 1,000 req/s: four runs' worth (4 x 250 requests) would be 1 s of arrivals, past MAX_SECONDS (here
    0.5 s): 500 requests; one run stays 250 (a settling run at 20 req/s took 40 s before the cap)."""
    import qbench.validate.serve as serve_module

    sizes: list[int] = []
    real_serve = serve_module.serve

    def recording_serve(runner, rows, arrivals_ms, *args, **kwargs):
        sizes.append(arrivals_ms.size)
        return real_serve(runner, rows, arrivals_ms, *args, **kwargs)

    monkeypatch.setattr(serve_module, "serve", recording_serve)
    monkeypatch.setattr(serve_module, "MAX_SECONDS", 0.5)
    server = real_server(SleepingRunner(), ROWS, Batcher(8, 1.0), seed=0)
    server(1_000.0, 0.0, 1000.0)
    server(1_000.0, 0.0, 1000.0, runs=4)
    assert sizes == [250, 500]


@pytest.mark.parametrize(("requests", "mean_batch", "runs"), [
    (200, 1.0, SETTLE_RUNS),  # small batches: four runs hold 800 batches
    (200, 6.0, SETTLE_RUNS),  # 800 requests, 133 batches
    (200, 27.0, 9),  # 800 requests would be 29 batches, no bound: 60 batches need 1,620 requests, 9 runs' worth
    (1000, 64.0, SETTLE_RUNS),  # 4,000 requests, 62 batches
    (200, 64.0, 20),  # 3,840 requests for 60 batches
])  # fmt: skip
def test_a_settling_run_is_long_enough_for_its_batches_to_bound_the_servers_capacity(requests, mean_batch, runs):
    """A run that could not tell is served again SETTLE_RUNS runs long, or longer where its batches are so large that
    the longer run would still hold too few of them to bound a capacity (twice MIN_BATCHES)."""
    first = LoadStats(100.0, requests, 1.0, 2.0, 3.0, 1.0, 0.1, mean_batch, 100.0, keep_up_undecided="too few batches")
    assert settling_runs(first) == runs
    assert runs * requests >= 2 * MIN_BATCHES * mean_batch
