"""Batching under load: Poisson arrivals, a dynamic batcher, one model instance, simulated deterministically.

In the spirit of MLPerf's server scenario and Triton's dynamic batcher: requests arrive at a
target rate (exponential gaps), wait in one FIFO queue, and the batcher sends up to
`max_batch_size` of them to the model as soon as the model is free and either the batch is
full or the oldest request has waited `max_queue_delay_ms`.

A batch that starts on an idle model is charged its own service times (`idle`): timed runs back to
back leave the runtime's worker threads spinning and its caches hot, while a batcher that waited for
its queue delay or for an arrival must first wake up (its timer fires late), gather the requests' rows
and run on a runtime whose threads have parked. On a 2-core CPU that cost 0.1 to 0.15 ms per batch,
several times a small model's back-to-back run (bench/serving_validation.py). A batch that starts the
moment the previous one ends (the model was busy: the batcher never slept) is charged the back-to-back
times (the sweep adds gathering the batch's rows to them: qbench.serving.served_times).

Why a simulation and not a real-time load test: on a small shared machine a threaded load
generator measures its own scheduling noise. The sweep measures the model's service time per
batch size on the real runner (many timed runs), and this module replays arrivals against
that measured distribution (`MeasuredServiceTimes`), with a fixed seed, so the same recipe
gives the same figures and the queueing arithmetic can be tested against a model with a known
service time (`FixedServiceTime`: M/D/1 at batch size 1). What it leaves out: the request's
own transport, and interference between requests running concurrently (one model instance).

The search for the highest rate within a budget (qbench.validate.load_search) replays the same unit arrival gaps and
service draws at every rate it tries (common random numbers), so figures at neighbouring rates are comparable.
`LoadReplay.batches` counts the batches it simulated, the unit of the simulation's cost.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
from numpy.typing import ArrayLike

from qbench.errors import QbenchError
from qbench.results.serving import LoadStats
from qbench.validate.tail import Cycles, ShareOver, TailBound, Verdict, regenerations, tail_share_bound


class ServiceTimes(Protocol):
    """How long the model takes for a batch: each of `quantiles` (in [0, 1)) picks a draw from its distribution;
    `idle`: the batch starts on an idle model (see the module's doc)."""

    def service_ms(self, batch_size: int, quantiles: ArrayLike, idle: bool = False) -> np.ndarray: ...

    @property
    def max_batch_size(self) -> int: ...


@dataclass(frozen=True)
class FixedServiceTime:
    """Every batch of `batch_size` rows takes `base_ms + per_item_ms * batch_size`, plus `idle_ms` when it starts on
    an idle model (tests, and what-ifs)."""

    base_ms: float
    per_item_ms: float = 0.0
    max_batch_size: int = 1
    idle_ms: float = 0.0

    def service_ms(self, batch_size: int, quantiles: ArrayLike, idle: bool = False) -> np.ndarray:
        return np.full(np.shape(quantiles),
                       self.base_ms + self.per_item_ms * batch_size + (self.idle_ms if idle else 0.0))  # fmt: skip


@dataclass(frozen=True)
class HostWork:
    """`service`'s times plus `per_row_ms` for each row of the batch: per-request work (pre-processing: tokenising,
    decoding) done on the CPUs the model runs on, which it takes from the model as the batch's requests come in, so
    the model serves fewer requests a second (qbench.serving charges it where the backend runs the model on the
    host)."""

    service: ServiceTimes
    per_row_ms: float

    def __post_init__(self) -> None:
        if not (self.per_row_ms >= 0 and math.isfinite(self.per_row_ms)):
            raise QbenchError(f"per_row_ms must be a finite number >= 0, got {self.per_row_ms}")

    @property
    def max_batch_size(self) -> int:
        return self.service.max_batch_size

    def service_ms(self, batch_size: int, quantiles: ArrayLike, idle: bool = False) -> np.ndarray:
        return self.service.service_ms(batch_size, quantiles, idle) + self.per_row_ms * batch_size


class _SampledSizes:
    """Sorted timings per batch size, read at a quantile; sizes between two measured ones interpolate."""

    def __init__(self, samples_ms: Mapping[int, np.ndarray], what: str) -> None:
        usable = {int(bs): np.sort(np.asarray(v, dtype=np.float64)) for bs, v in samples_ms.items() if len(v)}
        if not usable:
            raise QbenchError(f"no {what} to simulate load with")
        for bs, values in usable.items():
            if bs <= 0 or not np.all(np.isfinite(values)) or values[0] < 0:
                raise QbenchError(f"{what} at batch size {bs} must be finite and non-negative")
        self.sizes = sorted(usable)
        self._samples = usable

    def _at(self, batch_size: int, quantiles: np.ndarray) -> np.ndarray:
        values = self._samples[batch_size]
        return values[np.minimum((quantiles * len(values)).astype(np.int64), len(values) - 1)]

    def at(self, batch_size: int, quantiles: np.ndarray) -> np.ndarray:
        above = next(bs for bs in self.sizes if bs >= batch_size)
        below = max((bs for bs in self.sizes if bs <= batch_size), default=above)
        if below == above:
            return self._at(above, quantiles)
        weight = (batch_size - below) / (above - below)
        affine = (1 - weight) * self._at(below, quantiles) + weight * self._at(above, quantiles)
        # a batch whose time is its slowest row's (padded to its longest text, data-dependent work): the slowest of
        # batch_size / below batches of `below` rows, the quantile ** (below / batch_size) of `below`'s timings; never
        # above `above`'s at the quantile (a batch of fewer rows takes no longer)
        slowest = np.minimum(self._at(below, quantiles ** (below / batch_size)), self._at(above, quantiles))
        return np.maximum(affine, slowest)


class MeasuredServiceTimes:
    """Service times from timed runs of the real runner at a few batch sizes.

    A batch of a measured size draws from that size's timings (the `quantile`-th of them); a size
    between two measured ones takes the larger of the linear interpolation between the same quantile of
    both (latency close to affine in batch size) and the slowest of as many batches of the smaller size
    as it holds, capped by the larger size's time (a batch as slow as its slowest row: an affine
    interpolation of a row-dependent tail made a 20 ms budget look met at 2.8x the true rate); a size below the
    smallest measured one is charged that size's time (an upper bound). Sizes above the largest measured one are not
    served. `idle_samples_ms`: the same sizes timed from a batcher's wake-up on an idle model (qbench.validate.latency.
    measure_batcher_samples), drawn for batches that start on an idle model; without them every batch
    draws from the back-to-back timings.
    """

    def __init__(
        self, samples_ms: Mapping[int, np.ndarray], idle_samples_ms: Mapping[int, np.ndarray] | None = None
    ) -> None:
        self._busy = _SampledSizes(samples_ms, "service times")
        self._idle = None if idle_samples_ms is None else _SampledSizes(idle_samples_ms, "idle service times")
        if self._idle is not None and self._idle.sizes != self._busy.sizes:
            raise QbenchError(f"idle service times are for batch sizes {self._idle.sizes}, expected {self._busy.sizes}")

    @property
    def max_batch_size(self) -> int:
        return self._busy.sizes[-1]

    def service_ms(self, batch_size: int, quantiles: ArrayLike, idle: bool = False) -> np.ndarray:
        if batch_size > self.max_batch_size:
            raise QbenchError(f"batch size {batch_size} is above the largest measured one ({self.max_batch_size})")
        sampled = self._idle if idle and self._idle is not None else self._busy
        return sampled.at(batch_size, np.asarray(quantiles, dtype=np.float64))


@dataclass(frozen=True)
class Batcher:
    max_batch_size: int
    max_queue_delay_ms: float

    def __post_init__(self) -> None:
        if self.max_batch_size <= 0:
            raise QbenchError(f"max_batch_size must be positive, got {self.max_batch_size}")
        if not (self.max_queue_delay_ms >= 0 and math.isfinite(self.max_queue_delay_ms)):
            raise QbenchError(f"max_queue_delay_ms must be a finite number >= 0, got {self.max_queue_delay_ms}")


@dataclass(frozen=True)
class Draws:
    """The random numbers a simulation uses: unit-rate exponential gaps and one service quantile per batch; `seed`:
    what they were drawn with (None: given by hand), so that more of them can be drawn."""

    unit_gaps: np.ndarray
    quantiles: np.ndarray
    seed: int | None = None

    @classmethod
    def make(cls, requests: int, seed: int, *, stream: Sequence[int] = ()) -> Draws:
        """`requests` draws of `seed`; a `stream` (numbers >= 0) draws from a stream of the seed independent of the
        seed's own and of every other stream's (the same seed alone began its draws with the seed's own: a replay on
        more requests held the first one's arrivals, and a run quiet or unlucky by chance carried its luck on)."""
        if requests <= 0:
            raise QbenchError(f"requests must be positive, got {requests}")
        rng = np.random.default_rng([seed, *stream] if stream else seed)
        return cls(rng.exponential(1.0, size=requests), rng.random(size=requests), seed)

    @property
    def requests(self) -> int:
        return self.unit_gaps.size


_SHIFT = 12
_BLOCK = 1 << _SHIFT  # service times looked up together
CHECK_EVERY = 4096  # batches between two looks at whether a run's share over the budget is decided
RUN_AFTER = 4  # full batches back to back in a row before a stretch of them is replayed whole, on this many at first


class LoadReplay:
    """One model instance behind `batcher`, replaying `draws` at any rate.

    The service time of the k-th batch depends on its size, on whether it starts on an idle model and
    on the k-th quantile draw only, not on the rate: each (size, idle) column is looked up once and
    reused by every rate a search tries.
    """

    def __init__(self, service: ServiceTimes, batcher: Batcher, draws: Draws) -> None:
        if batcher.max_batch_size > service.max_batch_size:
            raise QbenchError(
                f"max_batch_size {batcher.max_batch_size} is above the largest measured batch size "
                f"{service.max_batch_size}"
            )
        self.service, self.batcher, self.draws = service, batcher, draws
        self.capacity_rps = capacity_rps(service, batcher.max_batch_size)
        blocks = -(-draws.requests // _BLOCK)
        # [idle][batch size][k // _BLOCK]: the k-th batch's service time, looked up a block at a time when first read
        # (a batch size may occur a few times only, so a whole column would mostly go unread)
        self._columns = [[[None] * blocks for _ in range(batcher.max_batch_size + 1)] for _ in (False, True)]
        self._full: np.ndarray | None = None  # the back-to-back column of full batches
        self._unit_arrivals = np.cumsum(draws.unit_gaps)  # at rate r, times 1000 / r ms
        self.batches = 0  # simulated so far, over every rate (a run stopped early: its batches until then)

    def _block(self, batch_size: int, idle: bool, block: int) -> list[float]:
        within = slice(block * _BLOCK, (block + 1) * _BLOCK)
        if batch_size == self.batcher.max_batch_size and not idle:  # full batches back to back: looked up whole
            values = self._full_column()[within]
        else:
            values = self.service.service_ms(batch_size, self.draws.quantiles[within], idle=idle)
        self._columns[idle][batch_size][block] = values.tolist()
        return self._columns[idle][batch_size][block]

    def _full_column(self) -> np.ndarray:
        """The service times of full batches back to back (`_full_run` reads them whole)."""
        if self._full is None:
            self._full = self.service.service_ms(self.batcher.max_batch_size, self.draws.quantiles)
        return self._full

    def with_requests(self, requests: int, *, independent: bool = False, again: int = 0) -> LoadReplay:
        """The same server replaying `requests` draws of the same seed (draws given by hand cannot grow): the seed's
        first ones, which begin with these draws' arrivals (a search's rounds: qbench.validate.load_search), or, where
        `independent`, a stream of the seed of their own, independent of these draws and of those of any other
        `requests` or `again` (the how-many-th independent replay of as many requests, from 0)."""
        if self.draws.seed is None:
            raise QbenchError("draws given by hand cannot be extended: make them with Draws.make")
        stream = ((requests, again) if again else (requests,)) if independent else ()
        return type(self)(self.service, self.batcher, Draws.make(requests, self.draws.seed, stream=stream))

    def at(self, rate_rps: float, *, overhead_ms: float = 0.0) -> LoadStats:
        """Poisson arrivals at `rate_rps`, every request served; `overhead_ms` (per-request time outside the model
        and the queue: pre-processing) is added to each latency."""
        return self._whole(rate_rps, overhead_ms)[0]

    def within(self, rate_rps: float, budget_ms: float, *, overhead_ms: float = 0.0) -> tuple[LoadStats, TailBound]:
        """The figures at `rate_rps` (as `at`) and how surely their p99 is within `budget_ms`: the share of requests
        over it with its upper confidence bound over the regenerative cycles (qbench.validate.tail)."""
        stats, latencies, first = self._whole(rate_rps, overhead_ms)
        return stats, tail_share_bound(latencies, first, budget_ms)

    def run(self, rate_rps: float, budget_ms: float, *,
            overhead_ms: float = 0.0) -> tuple[LoadStats, np.ndarray, Cycles]:
        """The figures at `rate_rps` (as `at`), each request's latency, and the requests over `budget_ms` in each
        regenerative cycle of the run, to be pooled with other runs' (qbench.validate.tail.Cycles)."""
        stats, latencies, first = self._whole(rate_rps, overhead_ms)
        return stats, latencies, Cycles.of(latencies, first, budget_ms)

    def verdict(self, rate_rps: float, budget_ms: float, *,
                overhead_ms: float = 0.0) -> tuple[Verdict, LoadStats | None]:
        """Whether the p99 at `rate_rps` is shown within `budget_ms` (a rate at or above capacity, or whose simulated
        p99 is over the budget, fails), with the figures (as `within`). A run stops as soon as more than TAIL_SHARE of
        its requests are over the budget (`ShareOver`): it fails whatever follows, and has no figures (None)."""
        replayed = self._replay(rate_rps, overhead_ms, budget_ms)
        if replayed is None:
            return Verdict.FAIL, None
        stats, latencies, first = replayed
        if stats.overloaded or stats.p99_ms > budget_ms:
            return Verdict.FAIL, stats
        return tail_share_bound(latencies, first, budget_ms).verdict(), stats

    def _whole(self, rate_rps: float, overhead_ms: float) -> tuple[LoadStats, np.ndarray, np.ndarray]:
        replayed = self._replay(rate_rps, overhead_ms)
        assert replayed is not None  # no budget: never stopped
        return replayed

    def _replay(
        self, rate_rps: float, overhead_ms: float, budget_ms: float | None = None
    ) -> tuple[LoadStats, np.ndarray, np.ndarray] | None:
        """The figures, each request's latency, and where the run regenerates (request indices); with `budget_ms`,
        None as soon as the share of requests over it is decided over TAIL_SHARE (`ShareOver`)."""
        if not (rate_rps > 0 and math.isfinite(rate_rps)):
            raise QbenchError(f"rate_rps must be a positive number, got {rate_rps}")
        arrivals_ms = self._unit_arrivals * (1000.0 / rate_rps)
        over = None if budget_ms is None else ShareOver(arrivals_ms, budget_ms, overhead_ms)
        batches = self._batches(arrivals_ms, over)
        if batches is None:
            self.batches += over.batches
            return None
        starts, sizes, ends = batches
        self.batches += sizes.size
        n = arrivals_ms.size
        done_ms = np.repeat(ends, sizes)
        latencies = done_ms - arrivals_ms + overhead_ms
        p50, p95, p99 = np.percentile(latencies, [50, 95, 99])
        span_ms = ends[-1] - arrivals_ms[0]
        stats = LoadStats(
            rate_rps=rate_rps,
            requests=n,
            p50_ms=float(p50),
            p95_ms=float(p95),
            p99_ms=float(p99),
            mean_ms=float(latencies.mean()),
            mean_wait_ms=float((np.repeat(starts, sizes) - arrivals_ms).mean()),
            mean_batch_size=n / len(sizes),
            achieved_rps=n * 1000.0 / span_ms if span_ms > 0 else math.inf,
            overloaded=rate_rps >= self.capacity_rps,
        )
        first = np.cumsum(sizes) - sizes
        return stats, latencies, regenerations(first, sizes, starts, arrivals_ms)

    def _batches(
        self, arrivals: np.ndarray, over: ShareOver | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """Each batch's start, size and end. The batcher waits for the model to be free, then until the batch is full
        or the oldest queued request has waited the queue delay (a busy model past the delay starts with what is
        queued). A batch starting after the model fell free starts on an idle model.

        Plain floats, one batch at a time, except stretches of full batches back to back (a busy model with
        max_batch_size requests queued, as near capacity), which `_full_run` replays whole once RUN_AFTER come in a
        row: the same float operations in the same order, so the same figures to the bit (tests/validate/
        test_load_fast.py keeps the plain loop and compares the two). `over`: asked every CHECK_EVERY batches
        whether the share over the budget is decided over TAIL_SHARE; if so, None."""
        n, size, delay = arrivals.size, self.batcher.max_batch_size, self.batcher.max_queue_delay_ms
        # the arrivals as floats, converted a block at a time as batches reach them (a run stopped early reads few)
        times = arrivals[: min(n, _BLOCK + size)].tolist()
        converted = len(times)
        columns = self._columns
        starts: list[float] = []
        counts: list[int] = []
        ends: list[float] = []
        free, i, k, check = 0.0, 0, 0, CHECK_EVERY if over is not None else -1
        full, window = 0, RUN_AFTER  # full batches back to back in a row; the stretch to try next
        shift, mask, run_after = _SHIFT, _BLOCK - 1, RUN_AFTER  # read once per batch: locals, not globals
        while i < n:
            if k >= check >= 0:
                if over.decided(starts, counts, ends):
                    return None
                check = k + CHECK_EVERY
            if full >= run_after:
                taken = self._full_run(arrivals, i, free, k, window, starts, counts, ends)
                i, k, free = i + taken * size, k + taken, ends[-1]
                window, full = (window * 2, full) if taken == window else (run_after, 0)
                continue
            if i + size >= converted < n:  # the batch reads up to the arrival after its last request
                times += arrivals[converted : i + size + _BLOCK].tolist()
                converted = len(times)
            first = times[i]
            due = first + delay
            if free <= first and size > 1 and (i + 1 == n or times[i + 1] > due):  # alone on an idle model
                start, count = due, 1  # what the lines below give, without their search
            else:
                earliest = free if free > first else first
                deadline = due if due > earliest else earliest
                last = i + size - 1
                if last < n and times[last] <= deadline:
                    start = times[last] if times[last] > earliest else earliest
                    count = bisect_right(times, start, i, last + 1) - i
                else:
                    start = deadline
                    count = bisect_right(times, start, i, last + 1 if last < n else n) - i
            idle = start > free
            full = full + 1 if count == size and start == free else 0
            block = columns[idle][count][k >> shift]
            if block is None:
                block = self._block(count, idle, k >> shift)
            free = start + block[k & mask]
            starts.append(start)
            counts.append(count)
            ends.append(free)
            i += count
            k += 1
        return np.asarray(starts), np.asarray(counts, dtype=np.int64), np.asarray(ends)

    def _full_run(self, arrivals: np.ndarray, i: int, free: float, k: int, window: int, starts: list[float],
                  counts: list[int], ends: list[float]) -> int:  # fmt: skip
        """Full batches back to back from request i (the k-th batch) on a model busy until `free`, as many as hold
        within `window` batches: each starts as the previous one ends, while its last request arrived by then.
        Appends them; their number (0: none held)."""
        size = self.batcher.max_batch_size
        batches = min(window, (arrivals.size - i) // size)
        if batches == 0:
            return 0
        # ends in the loop's order: ((free + s_k) + s_k+1) + ..., which accumulate adds one after the other
        chained = np.add.accumulate(np.concatenate(([free], self._full_column()[k : k + batches])))
        held = arrivals[i + size - 1 : i + batches * size : size] <= chained[:-1]
        taken = batches if held.all() else int(np.argmin(held))
        starts.extend(chained[:taken].tolist())
        counts.extend([size] * taken)
        ends.extend(chained[1 : taken + 1].tolist())
        return taken


def simulate(
    service: ServiceTimes, batcher: Batcher, rate_rps: float, draws: Draws, *, overhead_ms: float = 0.0
) -> LoadStats:
    """Replay Poisson arrivals at `rate_rps` through `batcher` onto one model instance (see `LoadReplay.at`)."""
    return LoadReplay(service, batcher, draws).at(rate_rps, overhead_ms=overhead_ms)


_QUANTILE_GRID = (np.arange(4096) + 0.5) / 4096  # evenly spread: the mean of its draws is the distribution's mean


def capacity_rps(service: ServiceTimes, batch_size: int) -> float:
    """Requests per second the model sustains at full `batch_size` batches back to back: the batch size over the
    mean service time. The mean, not the median: a queue fed faster than that grows without bound, and timings with
    a heavy tail (a shared CPU preempting the runtime for milliseconds) have a mean well above their median (2x for
    the digits CNN at batch 32 on a busy 2-CPU machine)."""
    mean_ms = float(np.mean(service.service_ms(batch_size, _QUANTILE_GRID)))
    return batch_size * 1000.0 / max(mean_ms, 1e-9)


def relaxation_requests(service: ServiceTimes, batch_size: int, rate_rps: float) -> float:
    """The arrivals over which one instance serving full `batch_size` batches at `rate_rps` forgets a burst (inf at or
    above capacity): its heavy-traffic relaxation time, rho^2 (1 + b cv^2) / (1 - rho)^2 at load rho = rate /
    `capacity_rps`, where cv is the full batch's service-time variation (the arrivals' and the services' variance
    over the square of the drift that drains the queue). Near capacity the requests over a budget come in excursions
    of this order, and a run spanning few of them shows a share over the budget that is low by chance too often."""
    load = rate_rps / capacity_rps(service, batch_size)
    if load >= 1:
        return math.inf
    times = service.service_ms(batch_size, _QUANTILE_GRID)
    variation = float(np.var(times) / max(float(np.mean(times)) ** 2, 1e-18))
    return load**2 * (1 + batch_size * variation) / (1 - load) ** 2


def throughput_falls(service: ServiceTimes, batch_size: int) -> bool:
    """Whether some batch smaller than `batch_size` serves more requests a second than full `batch_size` batches back
    to back (`capacity_rps`): throughput falling with the batch (cache effects, padding to the longest row). A
    saturated batcher forms full batches, its slowest per request, so near their capacity the queue idles along on
    mid-sized batches and now and then, after a burst, falls into full batches that drain it barely faster than it
    fills: rare, long excursions that a short replay can miss altogether (qbench.validate.load_search)."""
    full = capacity_rps(service, batch_size)
    return any(capacity_rps(service, size) > full for size in range(1, batch_size))
