"""results.json: the strict JSON of a sweep's results, its content digest, and reading it back into typed results
with every field checked (older files' absent fields read as their defaults; a file another qbench wrote says so)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from pathlib import Path
from typing import Any

import qbench
from qbench.errors import QbenchError, short_repr
from qbench.files import write_atomically
from qbench.results.evidence import evidence_from_dict
from qbench.results.fields import checked_params, known_fields, unique_json
from qbench.results.kept import kept_from_dict
from qbench.results.ranges import RangeAnalysis, bounds, counts, figures, ranges_from_dict
from qbench.results.search import SearchReport, search_from_dict
from qbench.results.serving import serving_from_dict
from qbench.results.sweep_results import (
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
)

DIGEST_FIELD = "digest"



def _jsonable(value: Any) -> Any:
    """Dataclasses to dicts; NaN/inf become null so the file is strict JSON (and fails the gate)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Path):
        return str(value)
    if hasattr(value, "item") and callable(value.item):  # numpy scalars
        return _jsonable(value.item())
    return value


def to_jsonable(value: Any) -> Any:
    """`value` (results, one of their parts) as strict-JSON-ready Python values."""
    return _jsonable(value)


def canonical_sha256(value: Any) -> str:
    """sha256 of the canonical JSON (sorted keys, no spaces) of a JSON value."""
    canonical = json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


def content_digest(raw: dict[str, Any]) -> str:
    """The digest results.json carries: over everything in it but the digest itself."""
    return canonical_sha256({k: v for k, v in raw.items() if k != DIGEST_FIELD})


def to_json(results: SweepResults | RangeAnalysis | SearchReport) -> str:
    """Strict JSON of the results (or of one of their sections); whole results carry their content digest."""
    raw = _jsonable(results)
    if isinstance(results, SweepResults):
        raw[DIGEST_FIELD] = content_digest(raw)
    return json.dumps(raw, indent=2, allow_nan=False)


def write_results(results: SweepResults, path: Path, *, what: str = "the results") -> Path:
    """Write atomically (qbench.files): a crash or a full disk mid-write never leaves a half file that looks like
    results, and an earlier results file stays as it was. `what` names the write in an error."""
    return write_atomically(path, to_json(results), what=what)


def _slice(raw: dict[str, Any], where: str) -> SliceMetrics:
    raw = known_fields(raw, SliceMetrics, where)
    return SliceMetrics(
        name=raw["name"],
        size=int(raw["size"]),
        metrics=figures(raw["metrics"]),
        intervals=bounds(raw.get("intervals")),
        drops=figures(raw.get("drops")),
        drop_intervals=bounds(raw.get("drop_intervals")),
        nonfinite_outputs=int(raw["nonfinite_outputs"]),
        new_nonfinite_outputs=int(raw.get("new_nonfinite_outputs", 0)),
        denominators=counts(raw.get("denominators")),
        changed_together=figures(raw.get("changed_together"), "changed_together"),
        spread=figures(raw.get("spread"), "spread"),
        kept={output: kept_from_dict(value, f"{where}.kept.{output}")
              for output, value in (raw.get("kept") or {}).items()},
        raised={str(name): str(why) for name, why in (raw.get("raised") or {}).items()},
    )  # fmt: skip


def _accuracy(raw: dict[str, Any] | None, where: str) -> AccuracyResult | None:
    if raw is None:
        return None
    raw = known_fields(raw, AccuracyResult, where)
    return AccuracyResult(
        rows=int(raw["rows"]),
        nonfinite_outputs=int(raw["nonfinite_outputs"]),
        overall=_slice(raw["overall"], f"{where}.overall"),
        slices=tuple(_slice(s, f"{where}.slices[{i}]") for i, s in enumerate(raw.get("slices", []))),
    )


def _latency(raw: dict[str, Any] | None, where: str) -> LatencyResult | None:
    if raw is None:
        return None
    raw = known_fields(raw, LatencyResult, where)
    return LatencyResult(
        threads=raw.get("threads"), session_create_ms=raw["session_create_ms"], first_run_ms=raw["first_run_ms"],
        points=tuple(_latency_point(p, f"{where}.points[{i}]") for i, p in enumerate(raw["points"])),
        machine=dict(raw.get("machine") or {}),
    )  # fmt: skip


_TIMES = ("p50_ms", "p95_ms", "p99_ms", "mean_ms", "items_per_s", "spread", "iqr_ratio", "others_cpus")


def _latency_point(raw: dict[str, Any], where: str) -> LatencyPoint:
    """Files written before adaptive timing have no window fields: they read as not judged. Every timing is a
    number or null (NaN), so what reads them (the gate's checks, the frontier's notes) compares numbers."""
    raw = known_fields(raw, LatencyPoint, where)
    times = figures({k: raw[k] for k in _TIMES if k in raw}, f"{where}:")
    windows = {k: tuple(figures(dict(enumerate(raw[k])), f"{where}.{k}").values())
               for k in ("window_p50_ms", "window_p99_ms") if k in raw}  # fmt: skip
    return LatencyPoint(**{**raw, **times, **windows})


def _distinct_inputs(raw: object) -> dict[str, int]:
    """results.json's `distinct_inputs`: scope -> a whole number of inputs >= 1."""
    if not isinstance(raw, dict) or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 1
                                            for n in raw.values()):  # fmt: skip
        raise QbenchError(f"distinct_inputs: got {short_repr(raw)}, expected scope -> a whole number of inputs >= 1")
    return raw


def from_dict(raw: dict[str, Any]) -> SweepResults:
    """Rebuild results from parsed JSON. Raises QbenchError if the schema version is not this one."""
    version = raw.get("schema_version")
    if version != SCHEMA_VERSION:
        raise QbenchError(f"results schema_version {version!r} is not supported (expected {SCHEMA_VERSION})")
    raw = known_fields(raw, SweepResults, "results", extra=(DIGEST_FIELD,))
    calibration = raw.get("calibration")
    return SweepResults(
        schema_version=version,
        qbench_version=raw["qbench_version"],
        created_at=raw["created_at"],
        recipe=raw["recipe"],
        environment=raw.get("environment", {}),
        calibration=(CalibrationRecord(**known_fields(calibration, CalibrationRecord, "calibration"))
                     if calibration else None),  # fmt: skip
        evaluation_rows=int(raw["evaluation_rows"]),
        gate_metric=raw["gate_metric"],
        reference=raw["reference"],
        variants=tuple(variant_from_dict(v, f"variants[{i}]") for i, v in enumerate(raw["variants"])),
        frontier=tuple(FrontierPoint(**known_fields(p, FrontierPoint, f"frontier[{i}]"))
                       for i, p in enumerate(raw.get("frontier", []))),  # fmt: skip
        timings=raw.get("timings", {}),
        dropped_nonfinite=raw.get("dropped_nonfinite", {}),
        kept_nonfinite=raw.get("kept_nonfinite", {}),
        distinct_inputs=_distinct_inputs(raw.get("distinct_inputs", {})),
        ranges=ranges_from_dict(raw.get("ranges"), "ranges"),
        inputs=raw.get("inputs", {}),
        complete=raw.get("complete") is True,
        finished_at=raw.get("finished_at"),
        search=search_from_dict(raw.get("search"), "search"),
        evidence=evidence_from_dict(raw.get("evidence")),
        gate_metrics=tuple(str(m) for m in raw.get("gate_metrics") or ()),
    )


def variant_from_dict(v: dict[str, Any], where: str = "variant") -> VariantResult:
    """One variant x backend result from its parsed JSON (as results.json and job records hold it)."""
    v = known_fields(v, VariantResult, where)
    return VariantResult(
        variant=v["variant"],
        backend=v["backend"],
        precision=v["precision"],
        status=v["status"],
        params=checked_params(v.get("params", {}), f"{where}.params"),
        error=v.get("error"),
        model_path=v.get("model_path"),
        model_bytes=v.get("model_bytes"),
        model_sha256=v.get("model_sha256"),
        build_seconds=v.get("build_seconds"),
        notes=tuple(v.get("notes", [])),
        accuracy=_accuracy(v.get("accuracy"), f"{where}.accuracy"),
        latency=_latency(v.get("latency"), f"{where}.latency"),
        fidelity=(Fidelity(**known_fields(v["fidelity"], Fidelity, f"{where}.fidelity")) if "fidelity" in v
                  else Fidelity(UNKNOWN, UNKNOWN)),  # fmt: skip
        evaluated_model_path=v.get("evaluated_model_path"),
        serving=serving_from_dict(v.get("serving"), f"{where}.serving"),
    )


def read_results(path: Path, *, partial: bool = False) -> SweepResults:
    """Load results.json; any problem is a QbenchError naming the file: missing, not JSON, wrong shape,
    content that does not match its digest (edited or corrupted after the sweep), or an incomplete sweep (unless
    `partial`: an interrupted sweep's variants, to be shown, never judged)."""
    if not path.is_file():
        raise QbenchError(f"{path}: results file not found")
    raw: Any = None
    try:
        raw = unique_json(path.read_text(), parse_constant=_reject_constant)
        if not isinstance(raw, dict):
            raise QbenchError(f"expected a JSON object of results, got a {type(raw).__name__}")
        _check_digest(raw)
        if raw.get("complete") is not True and not partial:
            raise QbenchError(f"complete: got {raw.get('complete')!r}, expected true (the sweep was interrupted "
                              "or is still running): re-run `qbench sweep`")  # fmt: skip
        return from_dict(raw)
    except QbenchError as exc:
        raise QbenchError(f"{path}: {exc}{_written_by_another(raw)}") from None
    except (json.JSONDecodeError, UnicodeDecodeError, LookupError, TypeError, ValueError, AttributeError) as exc:
        raise QbenchError(f"{path}: not a valid qbench results file ({type(exc).__name__}: {exc})"
                          f"{_written_by_another(raw)}") from None  # fmt: skip


def _written_by_another(raw: Any) -> str:
    """Results an older or newer qbench wrote (CI judging a cached run after an upgrade): which one, the likeliest
    reason they do not read here."""
    version = raw.get("qbench_version") if isinstance(raw, dict) else None
    if not isinstance(version, str) or version == qbench.__version__:
        return ""
    return (f"; written by qbench {short_repr(version)}, this is qbench {qbench.__version__}: judge them with that "
            "version, or re-run `qbench sweep` with this one")  # fmt: skip


def _reject_constant(name: str) -> float:
    """qbench writes strict JSON (NaN/inf as null): a bare NaN or Infinity was not written by it."""
    raise QbenchError(f"holds {name}, which qbench never writes (non-finite values are written as null)")


def _check_digest(raw: dict[str, Any]) -> None:
    recorded = raw.get(DIGEST_FIELD)
    if not isinstance(recorded, str):
        raise QbenchError(f"{DIGEST_FIELD}: missing: results without their content digest cannot be trusted")
    if recorded != content_digest(raw):
        raise QbenchError(f"{DIGEST_FIELD}: does not match the file's content (edited or corrupted after the sweep)")
