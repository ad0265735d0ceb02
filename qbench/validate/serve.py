"""A real open-loop server in this process: what the load simulation's highest rate is checked against.

The simulation (qbench.validate.load) replays measured service times and models no server: no enqueueing, no
hand-off between threads, no waking, no stamping of completions. On a small CPU that per-request work runs on
the cores the model runs on, slows its runs and caps the throughput; for the digits CNN the simulated highest
rate within budget was 1.2-3.2x what a real in-process server sustained. So the sweep serves real requests at
the simulated answer and steps down until a real run meets the budget, then bisects up to the lowest rate that failed
(`served_max_rate`), and reports that.

The server: a client thread sends one-row requests at Poisson arrival times (open loop: a late client counts
against the server), a batcher thread takes the oldest request once the model is free, waits until the batch is
full or that request has waited the queue delay, concatenates the rows (a model with a fixed batch gets them filled up
to its batch by repeating them, as a server in front of it must, and as the simulation charges such a batch the fixed
batch's timings; padded text is cut back to the batch's own longest row, as the timed batches were), runs them on the
runner as a server does (`served_call`: numpy in, numpy out, modes entered once for the batcher thread) and stamps each
request's completion. Latency = completion - scheduled arrival, plus the per-request overhead (pre-processing) the
simulation adds too. It is the least a server does (no transport, no serialisation), so a real deployment with a
network in front sustains no more.
"""

from __future__ import annotations

import math
import sys
import threading
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from qbench.backends.base import Runner, served_call
from qbench.data.feeds import take_batch
from qbench.data.text import Padding
from qbench.results.serving import LoadStats
from qbench.validate.keep_up import MIN_BATCHES, KeepUp, keep_up
from qbench.validate.load import Batcher
from qbench.validate.tail import Verdict

# the client and the batcher are Python threads: with CPython's default 5 ms switch interval a client busy sending
# requests holds the batcher off for up to 5 ms, a cost of this server's language, not of serving
SWITCH_INTERVAL_S = 50e-6
RUN_SECONDS = 0.25  # each real run sends about this long of arrivals (at least MIN_REQUESTS, at most MAX_REQUESTS)
# a fast model's run holds no more requests: at 140,000 req/s the client thread's own bookkeeping for 70,000 took
# longer than their arrivals, and a sweep of the digits CNN spent 6 s a variant serving
MAX_REQUESTS = 20_000
MIN_REQUESTS = 200  # at least twice MIN_P99_SAMPLES: a p99 from fewer holds one or two samples beyond it
STEP = 0.8  # a rate the real server misses is retried this much lower
MAX_RUNS = 16  # real runs at most; when none passes, no rate is claimed
MAX_SECONDS = 10.0  # of arrivals over all runs: a rate whose run would pass it is not tried (none is claimed)
# runs the search may make, each within MAX_SECONDS on its own, before it claims a rate whatever MAX_SECONDS: the run
# at the simulated rate, a step down and the run confirming it, one step more. A run holds MIN_REQUESTS however low
# its rate (5 s at 39.6 req/s), so MAX_SECONDS alone left a slow model no step down after one miss and, below 40
# req/s, no run confirming a pass: no rate was claimed, though the budget's 20 req/s was met
FIRST_CLAIM_RUNS = 4
# a run at the budget's rate that cannot tell whether the server keeps up is served again once, at least this many
# runs' worth of requests long (the capacity bound narrows as the square root of its batches: to half as wide)
SETTLE_RUNS = 4


@dataclass(frozen=True)
class Served:
    latencies_ms: np.ndarray  # per request: completion - scheduled arrival
    client_lag_ms: np.ndarray  # per request: enqueued - scheduled arrival
    batch_sizes: np.ndarray
    assembly_ms: np.ndarray  # per batch: concatenating the requests' rows
    run_ms: np.ndarray  # per batch: the runner's served call (qbench.backends.base.served_call)
    arrivals_ms: np.ndarray  # scheduled, from the first
    # per request: completion, from the first scheduled arrival; for the requests a given-up run left unserved, when
    # it was given up (or their arrival, if later): a lower bound of their latency
    done_ms: np.ndarray
    completed: int  # requests served (a prefix: the queue is FIFO)
    # per batch: the server's work on it (from taking it to taking the next, less the batcher's waits for requests)
    # and whether the model idled (the batcher waited) before it was taken; a given-up run's last batch has neither
    work_ms: np.ndarray
    idle_before: np.ndarray
    max_batch_size: int

    def keeps_up(self, rate_rps: float) -> KeepUp:
        """Whether the run shows the server keeping up at `rate_rps`, falling behind, or cannot tell
        (qbench.validate.keep_up: the batches' work bounds the server's capacity)."""
        return keep_up(rate_rps, self.batch_sizes[: self.work_ms.size], self.work_ms, self.idle_before,
                       self.max_batch_size,
                       self.arrivals_ms, self.done_ms, self.completed)  # fmt: skip


def serve(
    runner: Runner, rows: Mapping[str, np.ndarray], arrivals_ms: np.ndarray, batcher: Batcher,
    late_ms: float = math.inf,
    fixed_batch: int | None = None, padding: Padding | None = None, first_row: int = 0,
) -> Served:
    """Serve one request per arrival (row (first_row + k) % len(rows)) through a real dynamic batcher; see the module
    doc. `rows` must be concatenable one by one (text at its set's padded length); with `padding`, each batch is cut
    back to its own longest row once concatenated, as a server padding each batch runs it. `fixed_batch`: the model
    takes batches of that many rows only; a smaller batch of requests is filled up to it (its rows repeated). Once more
    than 1 % of the requests took longer than `late_ms` the run is given up (its p99 is past `late_ms` whatever
    follows): a server that falls behind would otherwise take its whole backlog's time to drain."""
    n = arrivals_ms.size
    count = len(next(iter(rows.values())))
    row_of = (first_row + np.arange(n)) % count
    # one single-row copy per distinct row, shared by every request it serves (a run holds up to MAX_REQUESTS)
    singles = {int(r): {name: np.ascontiguousarray(a[r : r + 1]) for name, a in rows.items()}
               for r in np.unique(row_of)}
    queue: deque[int] = deque()
    ready = threading.Condition()
    enqueued, done = np.zeros(n), np.full(n, math.inf)
    completed: list[int] = [0]
    late_s, late_allowed = late_ms / 1000.0, n // 100
    sizes: list[int] = []
    taken: list[float] = []  # when each batch was taken, and (last) when the batcher was done with the last one
    waited: list[float] = []  # per batch: how long the batcher waited for requests before taking it
    assembly: list[float] = []
    runs: list[float] = []
    delay_s = batcher.max_queue_delay_ms / 1000.0
    failure: list[BaseException] = []
    given_up: list[bool] = []
    t0 = time.perf_counter() + 0.05
    scheduled_s = t0 + arrivals_ms / 1000.0

    def client() -> None:
        k = 0
        while k < n and not failure and not given_up:
            wait = scheduled_s[k] - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
            now = time.perf_counter()
            with ready:
                while k < n and scheduled_s[k] <= now:
                    queue.append(k)
                    enqueued[k] = now
                    k += 1
                ready.notify()

    def batching() -> None:
        served = late = 0
        try:
            with served_call(runner) as call:  # entered in this thread: a runner's modes are per thread
                while served < n:
                    idle = 0.0
                    with ready:
                        while not queue:
                            idle -= time.perf_counter()
                            ready.wait()
                            idle += time.perf_counter()
                        deadline = scheduled_s[queue[0]] + delay_s
                        while len(queue) < batcher.max_batch_size and (left := deadline - time.perf_counter()) > 0:
                            idle -= time.perf_counter()
                            ready.wait(left)
                            idle += time.perf_counter()
                        batch = [queue.popleft() for _ in range(min(len(queue), batcher.max_batch_size))]
                    started = time.perf_counter()
                    taken.append(started)
                    waited.append(idle)
                    feeds = {name: np.concatenate([singles[row_of[k]][name] for k in batch]) for name in rows}
                    if fixed_batch is not None and len(batch) < fixed_batch:
                        feeds = take_batch(feeds, fixed_batch)
                    if padding is not None:
                        feeds = padding.trim(feeds)
                    assembled = time.perf_counter()
                    call(feeds)
                    finished = time.perf_counter()
                    done[batch] = finished
                    sizes.append(len(batch))
                    assembly.append((assembled - started) * 1000)
                    runs.append((finished - assembled) * 1000)
                    served += len(batch)
                    completed[0] = served
                    late += int(np.count_nonzero(finished - scheduled_s[batch] > late_s))
                    if late > late_allowed:
                        given_up.append(True)
                        return
                taken.append(time.perf_counter())
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            failure.append(exc)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    try:
        threads = [threading.Thread(target=client), threading.Thread(target=batching)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(interval)
    if failure:
        raise failure[0]
    done = np.where(np.isfinite(done), done, np.maximum(time.perf_counter(), scheduled_s))
    work = np.diff(taken) - np.append(waited[1:], 0.0)[: len(taken) - 1] if len(taken) > 1 else np.zeros(0)
    return Served((done - scheduled_s) * 1000, (enqueued - scheduled_s) * 1000, np.asarray(sizes), np.asarray(assembly),
                  np.asarray(runs), arrivals_ms - arrivals_ms[0], (done - scheduled_s[0]) * 1000, completed[0],
                  work * 1000, np.asarray(waited[: work.size]) > 0, batcher.max_batch_size)  # fmt: skip


def served_stats(served: Served, rate_rps: float, overhead_ms: float = 0.0) -> LoadStats:
    """The real run's figures in the simulation's terms; `overloaded` when the run showed the server falling behind,
    `keep_up_undecided` (why) when it could not tell whether it keeps up (`Served.keeps_up`)."""
    latencies = served.latencies_ms + overhead_ms
    p50, p95, p99 = np.percentile(latencies, [50, 95, 99])
    n, completed = latencies.size, served.completed
    span_ms = float(served.done_ms[completed - 1]) if completed else math.inf
    work_ms = np.repeat(served.run_ms + served.assembly_ms, served.batch_sizes)
    wait_ms = served.latencies_ms[:completed] - work_ms
    kept = served.keeps_up(rate_rps)
    return LoadStats(rate_rps=rate_rps, requests=n, p50_ms=float(p50), p95_ms=float(p95), p99_ms=float(p99),
                     mean_ms=float(latencies.mean()), mean_wait_ms=float(wait_ms.mean()),
                     mean_batch_size=completed / len(served.batch_sizes),
                     achieved_rps=completed * 1000.0 / span_ms if span_ms > 0 else math.inf,
                     overloaded=kept.verdict is Verdict.FAIL,
                     keep_up_undecided=kept.reason if kept.verdict is Verdict.UNDECIDED else "")  # fmt: skip


class RealServer(Protocol):
    def __call__(self, rate_rps: float, overhead_ms: float, budget_ms: float, runs: int = 1) -> LoadStats:
        """The real figures at a Poisson rate (req/s), with a per-request overhead (ms), given up past a budget (ms),
        over `runs` runs' worth of requests in one (no more than MAX_SECONDS of arrivals, unless one run takes more:
        at 20 req/s four runs of MIN_REQUESTS would take 40 s)."""


def real_server(
    runner: Runner, rows: Mapping[str, np.ndarray], batcher: Batcher, seed: int, fixed_batch: int | None = None,
    padding: Padding | None = None,
) -> RealServer:
    """Real runs on `runner` at any rate: RUN_SECONDS of Poisson arrivals (MIN_REQUESTS to MAX_REQUESTS); the n-th run
    draws its arrivals from (`seed`, n) and serves the rows from where the run before it stopped, so two runs at a
    rate are two samples of its traffic (each replayed the same arrivals onto the same first rows: a run
    confirming another saw only the machine's noise again, and at a low rate the rows past the first
    MIN_REQUESTS were never served); `fixed_batch`: the model's fixed batch, which every batch is filled up to;
    `padding`: each batch is cut back to its own longest row (`serve`)."""
    count = len(next(iter(rows.values())))
    done = {"runs": 0, "requests": 0}  # over the runs so far

    def at(rate_rps: float, overhead_ms: float, budget_ms: float = math.inf, runs: int = 1) -> LoadStats:
        requests = min(requests_at(rate_rps) * runs, max(requests_at(rate_rps), math.ceil(MAX_SECONDS * rate_rps)))
        gaps = np.random.default_rng([seed, done["runs"]]).exponential(1.0, requests)
        served = serve(runner, rows, np.cumsum(gaps) * (1000.0 / rate_rps), batcher, budget_ms - overhead_ms,
                       fixed_batch, padding, first_row=done["requests"] % count)  # fmt: skip
        done["runs"] += 1
        done["requests"] += requests
        return served_stats(served, rate_rps, overhead_ms)

    return at


def settling_runs(first: LoadStats) -> int:
    """How many runs' worth of requests the run settling `first` (a run that could not tell) serves: SETTLE_RUNS, or
    more where `first`'s mean batch would leave it fewer than twice MIN_BATCHES batches (at 27 or more requests a
    batch, four runs of MIN_REQUESTS hold fewer than 30: no capacity bound at all, whatever the server). MAX_SECONDS
    of arrivals still caps it (`real_server`)."""
    wanted = 2 * MIN_BATCHES * max(first.mean_batch_size, 1.0)
    return max(SETTLE_RUNS, math.ceil(wanted / max(first.requests, 1)))


def requests_at(rate_rps: float) -> int:
    return max(MIN_REQUESTS, min(MAX_REQUESTS, math.ceil(rate_rps * RUN_SECONDS)))


@dataclass(frozen=True)
class ServedRate:
    """The highest rate two real runs met the budget at (None: no rate tried within the search's bounds was met in
    two runs, a run passing as the last the bounds allowed included), its real figures, the runs."""

    max_rate_rps: float | None
    at_max: LoadStats | None
    runs: int


def served_max_rate(
    server: RealServer, simulated_rps: float, budget_ms: float, overhead_ms: float = 0.0, rel_tol: float = 0.1
) -> ServedRate:
    """Serve real requests at `simulated_rps`, then STEP lower each time the real p99 breaks `budget_ms` or the
    server falls behind (STEP below the rate it served, when that is lower: its capacity), until one passes; then
    bisect between it and the lowest rate that failed, to `rel_tol`. A rate passes when two runs at it both do. At
    most MAX_RUNS runs and MAX_SECONDS of arrivals, but FIRST_CLAIM_RUNS runs while no rate is claimed yet (each no
    longer than MAX_SECONDS). Only a rate a real run passed is claimed, never above the simulated one (the simulation
    already failed every rate above it); a noisy run errs low, never high."""
    rate, failed, best, runs, seconds = simulated_rps, math.inf, None, 0, 0.0

    def run(rate: float) -> LoadStats | None:
        """A real run at `rate`, or None past the runs' or the seconds' bound."""
        nonlocal runs, seconds
        length = requests_at(rate) / rate
        first_claim = best is None and runs < FIRST_CLAIM_RUNS
        if runs >= MAX_RUNS or length > MAX_SECONDS or (seconds + length > MAX_SECONDS and not first_claim):
            return None
        runs += 1
        seconds += length
        return server(rate, overhead_ms, budget_ms)

    while best is None or math.isfinite(failed) and failed - best[0] > rel_tol * best[0]:
        stats = run(rate)
        if stats is not None and _meets(stats, budget_ms):  # confirmed by a second run: one calm run is not enough
            second = run(rate)
            stats = None if second is None else max(stats, second, key=_worse)
        if stats is None:
            break
        if _meets(stats, budget_ms):
            best = (rate, stats)
        else:
            failed = rate
        if best is not None:
            rate = (best[0] + failed) / 2
        else:  # a server that fell behind served about its capacity
            rate = STEP * min(rate, stats.achieved_rps)
    return ServedRate(best[0], best[1], runs) if best is not None else ServedRate(None, None, runs)


def _meets(stats: LoadStats, budget_ms: float) -> bool:
    """Within the budget, and shown keeping up: a run that cannot tell fails too (the search steps down)."""
    return stats.p99_ms <= budget_ms and not stats.overloaded and not stats.keep_up_undecided


def _worse(stats: LoadStats) -> tuple[bool, bool, float]:
    return stats.overloaded, bool(stats.keep_up_undecided), stats.p99_ms
