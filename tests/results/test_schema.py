"""results.json round trip of latency points: the adaptive-timing fields, and files written before them."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
from sweep_factory import make_sweep

import qbench
from qbench.errors import QbenchError
from qbench.results.schema import DIGEST_FIELD, content_digest, from_dict, read_results, to_json


def test_window_fields_round_trip_and_nan_spread_reads_back_as_nan() -> None:
    results = make_sweep()
    fp32 = results.variants[0]
    b1, b32 = fp32.latency.points
    points = (dataclasses.replace(b1, window_p50_ms=(1.0, 1.5), window_p99_ms=(2.0,), iqr_ratio=0.25, stable=False),
              dataclasses.replace(b32, window_p50_ms=(20.0, 20.5, 20.2), spread=0.025, iqr_ratio=0.1, stable=True))
    fp32 = dataclasses.replace(fp32, latency=dataclasses.replace(fp32.latency, points=points))  # fmt: skip
    results = dataclasses.replace(results, variants=(fp32, *results.variants[1:]))
    raw = json.loads(to_json(results))
    assert raw["variants"][0]["latency"]["points"][0]["spread"] is None  # NaN is written as null
    back = from_dict(raw).variants[0].latency.points
    assert back[0].window_p50_ms == (1.0, 1.5) and back[0].window_p99_ms == (2.0,) and back[0].stable is False
    assert math.isnan(back[0].spread) and back[0].iqr_ratio == 0.25
    assert back[1] == points[1]


def test_points_written_before_adaptive_timing_read_as_not_judged() -> None:
    raw = json.loads(to_json(make_sweep()))
    for key in ("window_p50_ms", "window_p99_ms", "spread", "iqr_ratio", "stable"):
        del raw["variants"][0]["latency"]["points"][0][key]
    point = from_dict(raw).variants[0].latency.points[0]
    assert point.stable is None and point.window_p50_ms == () and math.isnan(point.spread)


@pytest.mark.parametrize(("where", "edit"), [
    ("results", lambda raw: raw),
    ("calibration", lambda raw: raw["calibration"]),
    ("variants[0]", lambda raw: raw["variants"][0]),
    ("variants[0].accuracy", lambda raw: raw["variants"][0]["accuracy"]),
    ("variants[0].accuracy.slices[0]", lambda raw: raw["variants"][0]["accuracy"]["slices"][0]),
    ("variants[0].latency.points[0]", lambda raw: raw["variants"][0]["latency"]["points"][0]),
    ("variants[0].fidelity", lambda raw: raw["variants"][0]["fidelity"]),
])  # fmt: skip
def test_a_field_this_qbench_does_not_know_is_refused_in_every_section(tmp_path, where, edit) -> None:
    """An unknown key in `calibration` was refused while one in a variant (where a newer qbench could record what
    changes the verdict) was dropped without a word: every section now reads as the gate fails, closed."""
    raw = json.loads(to_json(make_sweep()))
    assert raw["calibration"] and raw["variants"][0]["accuracy"]["slices"]
    edit(raw)["tomorrows_verdict"] = "fail"
    raw[DIGEST_FIELD] = content_digest(raw)
    path = tmp_path / "results.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(QbenchError) as caught:
        read_results(path)
    assert str(caught.value) == (f"{path}: {where}: unknown field 'tomorrows_verdict': this qbench does not know it, "
                                 "and judges no results it would read without it")  # fmt: skip


@pytest.mark.parametrize(("change", "problem"), [
    ({"schema_version": 2}, "results schema_version 2 is not supported (expected 1)"),
    ({"calibration": {"rows": 64, "a_field_of_tomorrow": 1}}, "calibration: unknown field 'rows'"),
], ids=["newer-schema", "unknown-field"])  # fmt: skip
def test_results_another_qbench_wrote_say_which_one(tmp_path, change, problem) -> None:
    """CI judging a run cached before an upgrade read 'schema_version 2 is not supported', not why."""
    raw = {**json.loads(to_json(make_sweep())), **change, "qbench_version": "9.9.9"}
    raw[DIGEST_FIELD] = content_digest(raw)  # intact: the other version wrote it so
    path = tmp_path / "results.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(QbenchError) as caught:
        read_results(path)
    message = str(caught.value)
    assert message.startswith(f"{path}: {problem}")
    assert message.endswith(f"; written by qbench '9.9.9', this is qbench {qbench.__version__}: judge them with that "
                            "version, or re-run `qbench sweep` with this one")  # fmt: skip
    raw["qbench_version"] = qbench.__version__  # the same version: nothing to say about it
    raw[DIGEST_FIELD] = content_digest(raw)
    path.write_text(json.dumps(raw))
    with pytest.raises(QbenchError) as same:
        read_results(path)
    assert "written by qbench" not in str(same.value)


@pytest.mark.parametrize(("where", "key", "first", "edit"), [
    ("results", "complete", False, lambda raw: raw),
    ("variants[1].accuracy.overall.metrics", "accuracy", 0.1,
     lambda raw: raw["variants"][1]["accuracy"]["overall"]["metrics"]),
    ("variants[1]", "status", "failed", lambda raw: raw["variants"][1]),
])  # fmt: skip
def test_a_key_given_twice_is_refused_naming_where(tmp_path, where, key, first, edit) -> None:
    """An object naming a key twice kept its last value (Python's parser; others keep the first) and the digest, taken
    over what was kept, matched: `"complete": false` above the sweep's `"complete": true`, or a variant's accuracy 0.1
    above its 1.0, were judged by the later value, and the gate passed."""
    raw = json.loads(to_json(make_sweep()))
    raw[DIGEST_FIELD] = content_digest(raw)  # the sweep's own content: what a parser keeping the last value reads
    target = edit(raw)
    assert target[key] != first
    target["repeated-key"] = first
    target |= {k: target.pop(k) for k in list(target) if k != "repeated-key"}  # the repeated key first, then the rest
    path = tmp_path / "results.json"
    path.write_text(json.dumps(raw).replace('"repeated-key"', json.dumps(key)))
    with pytest.raises(QbenchError) as caught:
        read_results(path)
    assert str(caught.value).startswith(f"{path}: {where}: the key {key!r} is given twice, which qbench never writes")


def _full_sweep():
    """A sweep with every section that holds figures: serving (with both load simulations), range analysis, an INT8
    search and a frontier."""
    from qbench.results.ranges import ClipRecord, RangeAnalysis
    from qbench.results.schema import FrontierPoint
    from qbench.results.search import CandidateRecord, SearchReport
    from qbench.results.serving import LoadStats, ServingResult

    load = LoadStats(100.0, 5000, 1.0, 2.0, 3.0, 1.5, 0.1, 1.2, 100.0)
    serving = ServingResult(preprocess_ms_per_row=0.01, budget_ms=10.0, rate_rps=100.0, requests=5000, seed=0,
                            at_rate=load, max_rate_rps=400.0, at_max_rate=load, usd_per_million={"max_rate": 0.5},
                            simulated_requests=20_000, simulated_undecided=True)  # fmt: skip
    results = make_sweep()
    variants = (dataclasses.replace(results.variants[0], serving=serving), *results.variants[1:])
    ranges = RangeAnalysis(rows=10, seconds=0.5, nodes={"t": "n"}, abs_max={"overall": {"t": 3.0}},
                           clipping=(ClipRecord("int8", "overall", 2, 100, 0.02),))  # fmt: skip
    search = SearchReport("int8", "accuracy", 0.01, 0.02, 60.0, 5.0, "passed",
                          (CandidateRecord("a", "int8_static", speedup=1.2, metric=0.9),), chosen=0)  # fmt: skip
    frontier = (FrontierPoint("onnxruntime-cpu", 1, "fp32", 1.0, 0.95),)
    return dataclasses.replace(results, variants=variants, ranges=ranges, search=search, frontier=frontier)


def _at(raw, path):
    """The parent object and key of a dotted path with [i] indices ('variants[0].serving.at_max_rate.p99_ms')."""
    keys = [int(k) if k.isdigit() else k for k in path.replace("[", ".").replace("]", "").split(".")]
    for key in keys[:-1]:
        raw = raw[key]
    return raw, keys[-1]


@pytest.mark.parametrize(("path", "value", "expected"), [
    ("variants[0].accuracy.overall.intervals.accuracy[0]", "0.9", "a number or null"),
    ("variants[0].accuracy.slices[0].drops.accuracy", "0.01", "a number or null"),
    ("variants[0].accuracy.overall.size", 12.5, "a whole number >= 0"),
    ("variants[0].latency.session_create_ms", "3 ms", "a number or null"),
    ("variants[0].latency.points[0].batches", -1, "a whole number >= 0"),
    ("variants[0].serving.at_max_rate.p99_ms", "fast", "a number or null"),
    ("variants[0].serving.at_rate.requests", -5000, "a whole number >= 0"),
    ("variants[0].serving.usd_per_million.max_rate", "cheap", "a number or null"),
    ("variants[0].serving.max_rate_rps", True, "a number or null"),
    ("variants[0].model_bytes", -4, "a whole number >= 0"),
    ("calibration.held_out_rows", -1, "a whole number >= 0"),
    ("ranges.seconds", "0.5", "a number or null"),
    ("ranges.abs_max.overall.t", "big", "a number or null"),
    ("ranges.clipping[0].clipped", -2, "a whole number >= 0"),
    ("search.candidates[0].speedup", "1.2x", "a number or null"),
    ("frontier[0].p50_ms", "1.0", "a number or null"),
])  # fmt: skip
def test_every_figure_is_a_number_of_its_type_whether_or_not_the_verdict_rests_on_it(tmp_path, path, value,
                                                                                    expected) -> None:  # fmt: skip
    """Only the figures the verdict reads were checked: a string or a negative count elsewhere (an interval, a cost,
    a load simulation, the range analysis) was read as it was and rendered as a figure, or crashed a report."""
    raw = json.loads(to_json(_full_sweep()))
    from_dict(raw)  # the unedited sweep reads
    parent, key = _at(raw, path)
    assert parent[key] != value  # the field is there, holding another value
    parent[key] = value
    raw[DIGEST_FIELD] = content_digest(raw)
    file = tmp_path / "results.json"
    file.write_text(json.dumps(raw))
    with pytest.raises(QbenchError) as caught:
        read_results(file)
    assert str(caught.value).startswith(f"{file}: {path}: got {value!r}, expected {expected}")


def test_the_simulated_searchs_requests_and_whether_it_settled_round_trip() -> None:
    serving = from_dict(json.loads(to_json(_full_sweep()))).variants[0].serving
    assert serving.simulated_requests == 20_000 and serving.simulated_undecided is True


def _regression_sweep():
    """A sweep whose first two results are a regression FP32 and a variant scored by the sweep's evaluation, on two
    slices; and the variant's accuracy."""
    from qbench.results.schema import AccuracyResult
    from qbench.validate.accuracy import evaluate_accuracy, with_drops

    labels = np.array([0.0, 1.0, 2.0, 3.0, 4.0, 5.0])
    reference = labels + np.array([1.0, -1.0, 2.0, 0.0, 0.5, -0.5])
    outputs = reference + np.array([0.5, 0.0, -1.0, 0.5, 0.25, 0.0])
    halves = {"part=a": np.arange(6) < 3, "part=b": np.arange(6) >= 3}
    fp32 = evaluate_accuracy("regression", reference, reference, labels, halves)
    own: AccuracyResult = with_drops(evaluate_accuracy("regression", outputs, reference, labels, halves), fp32)
    results = make_sweep()
    variants = tuple(dataclasses.replace(v, accuracy=a) for v, a in zip(results.variants[:2], (fp32, own), strict=True))
    return dataclasses.replace(results, variants=variants), own


def test_drop_intervals_round_trip_per_scope_and_nan_reads_back_as_nan(tmp_path) -> None:
    results, own = _regression_sweep()
    assert set(own.overall.drop_intervals) == {"mae", "rmse", "r2", "r2_min"}
    read = from_dict(json.loads(to_json(results))).variants[1].accuracy
    assert read.overall.drop_intervals == own.overall.drop_intervals
    assert [s.drop_intervals for s in read.slices] == [s.drop_intervals for s in own.slices]
    assert read.slices[0].drop_intervals != read.overall.drop_intervals  # each scope its own rows
    nan = dataclasses.replace(own.overall, drop_intervals={"mae": (math.nan, 0.5)})
    edited = dataclasses.replace(results, variants=(results.variants[0], dataclasses.replace(
        results.variants[1], accuracy=dataclasses.replace(own, overall=nan))))  # fmt: skip
    raw = json.loads(to_json(edited))
    assert raw["variants"][1]["accuracy"]["overall"]["drop_intervals"] == {"mae": [None, 0.5]}
    low, high = from_dict(raw).variants[1].accuracy.overall.drop_intervals["mae"]
    assert math.isnan(low) and high == 0.5
    raw["variants"][1]["accuracy"]["overall"]["drop_intervals"]["mae"] = ["0.1", 0.5]
    raw[DIGEST_FIELD] = content_digest(raw)
    file = tmp_path / "results.json"
    file.write_text(json.dumps(raw))
    with pytest.raises(QbenchError) as caught:
        read_results(file)
    assert str(caught.value).startswith(f"{file}: variants[1].accuracy.overall.drop_intervals.mae[0]: got '0.1', "
                                        "expected a number or null")  # fmt: skip
