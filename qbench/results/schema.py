"""Typed, frozen results of a sweep, and their JSON form (results.json): the names to import them by. The dataclasses
live in qbench.results.sweep_results, writing and reading results.json in qbench.results.json_file.

Schema (version 1), documented in reports/README.md:

    SweepResults
      schema_version, qbench_version, created_at, recipe {name, path, sha256, task},
      environment {...}, calibration CalibrationRecord, evaluation_rows,
      gate_metric, gate_metrics [every gated metric, gate_metric first, where gate.metrics gates several; absent in
      results from before: gate_metric alone], reference, variants [VariantResult], frontier [FrontierPoint],
      timings {phase: seconds} (prepare, build, store, track, inference, simulation, jobs, ranges, report, total),
      dropped_nonfinite {evaluation|calibration: {input column: rows left out for NaN/inf}},
      kept_nonfinite {evaluation|calibration|selection|slice:<name>: {input column: rows fed with NaN/inf}},
      distinct_inputs {overall|<slice>: distinct inputs its rows feed the model, for scopes whose rows repeat some},
      ranges RangeAnalysis | null, inputs {input: {path, sha256}}, complete, finished_at,
      evidence [name]: the kinds of evidence the sweep recorded (results/evidence.py; absent: none),
      digest (sha256 of the canonical JSON of everything else; checked on reading)
    VariantResult
      variant, backend, precision, status ok|failed|skipped, error (or skip reason), params {...},
      model_path, model_bytes, model_sha256, build_seconds, notes [...],
      fidelity Fidelity, evaluated_model_path (the model whose outputs were scored, when not model_path),
      accuracy AccuracyResult | null, latency LatencyResult | null, serving ServingResult | null (results/serving.py)
    Fidelity: accuracy native|emulated|unknown, latency native|emulated|unknown, method (how it was emulated)
    AccuracyResult: rows, nonfinite_outputs, overall SliceMetrics, slices [SliceMetrics]
    SliceMetrics: name, size, metrics {m: value}, intervals {m: [lo, hi]}, drops {m: drop vs FP32},
      drop_intervals {m: [lo, hi] of the drop, paired row by row with FP32 (regression's mae, rmse, r2)},
      nonfinite_outputs, new_nonfinite_outputs, denominators {m: count its rate is a share of, when not size},
      changed_together {m: changed units a changed unit shares its row with, weighted by changes (tokens)},
      spread {output: how much it varies across the scope's rows (metrics.spread)},
      kept {output: Kept {rule, component, reference, own, chance, elsewhere}: what it kept least of, or lost
        (validate/kept.py)},
      raised {m: what a custom metric raised on this scope; m is NaN there}
    LatencyResult: threads, session_create_ms, first_run_ms, points [LatencyPoint]
    LatencyPoint: batch_size, warmup, iterations, p50_ms, p95_ms, p99_ms, mean_ms, items_per_s,
      window_p50_ms [..], window_p99_ms [..], spread, iqr_ratio, stable true|false|null
    RangeAnalysis (results/ranges.py): rows, seconds, nodes, abs_max, limits, clipping, warnings, unattributed
"""

from qbench.results.json_file import (
    DIGEST_FIELD,
    canonical_sha256,
    content_digest,
    from_dict,
    read_results,
    to_json,
    to_jsonable,
    variant_from_dict,
    write_results,
)
from qbench.results.kept import Kept
from qbench.results.ranges import ClipRecord, CoverageWarning, LimitCheck, RangeAnalysis, TensorPeak
from qbench.results.sweep_results import (
    EMULATED,
    NATIVE,
    SCHEMA_VERSION,
    UNKNOWN,
    AccuracyResult,
    CalibrationRecord,
    Fidelity,
    FrontierPoint,
    LatencyPoint,
    LatencyResult,
    SliceMetrics,
    SweepResults,
    VariantResult,
    non_default_session_options,
)

__all__ = [
    "DIGEST_FIELD", "EMULATED", "NATIVE", "SCHEMA_VERSION", "UNKNOWN", "AccuracyResult", "CalibrationRecord",
    "ClipRecord", "CoverageWarning", "Fidelity", "FrontierPoint", "Kept", "LatencyPoint", "LatencyResult",
    "LimitCheck", "RangeAnalysis", "SliceMetrics", "SweepResults", "TensorPeak", "VariantResult", "canonical_sha256",
    "content_digest", "from_dict", "non_default_session_options", "read_results", "to_json", "to_jsonable",
    "variant_from_dict", "write_results",
]
