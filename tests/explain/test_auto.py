"""`qbench explain` of a `calibrator: auto` variant without sweep results to follow chooses its calibrator by the
sweep's resolution rule (qbench.gate.resolution.passing): a pass the evaluation rows resolve before one resting on too
few of them, whatever their drops. The tries' builds and figures are fake; their verdicts are the real gate's."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from qbench.explain import sensitivity as explain
from qbench.explain.rank import Score
from qbench.gate.evaluate import judge
from qbench.gate.tolerance import reference_tolerances
from qbench.recipe.spec import GateSpec, VariantSpec
from qbench.results.schema import AccuracyResult, SliceMetrics, VariantResult
from qbench.variants import BuildContext

ROWS = 72
GATE = GateSpec(metric="cosine", max_drop=0.005, max_slice_drop=0.01)
# cosine against FP32's own outputs (FP32's interval a point), per calibrator: minmax drops least (0.0005) but its
# rows spread wide (the drop's interval reaches 0.010 > 0.005: unresolved); entropy drops 0.003, its interval within
# 0.004 (resolved); percentile breaches; dynamic drops 0.0044, unresolved.
FIGURES = {"fp32": (1.0, (1.0, 1.0)), "minmax": (0.9995, (0.990, 0.9999)), "entropy": (0.997, (0.996, 0.998)),
           "percentile": (0.97, (0.96, 0.98)), "dynamic": (0.9956, (0.989, 0.999))}  # fmt: skip


def _result(name: str) -> VariantResult:
    cosine, interval = FIGURES[name]
    overall = SliceMetrics("overall", ROWS, {"cosine": cosine}, drops={"cosine": 1.0 - cosine},
                           intervals={"cosine": interval})  # fmt: skip
    variant = "fp32" if name == "fp32" else "int8"
    return VariantResult(variant=variant, backend="cpu", precision=variant, status="ok",
                         accuracy=AccuracyResult(rows=ROWS, nonfinite_outputs=0, overall=overall))  # fmt: skip


def _explain_auto(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                  figures: dict[str, str]) -> tuple[VariantSpec, Score, str, list]:
    """Run explain's calibrator choice on fake builds judged by the real gate; `figures`: calibrator -> FIGURES key."""
    discarded = []
    monkeypatch.setattr(explain, "build_variant", lambda spec, ctx: SimpleNamespace(calibrator=spec.calibrator,
                                                                                     lowered_nothing=False))
    monkeypatch.setattr(explain, "discard_built", lambda built, *args, **kwargs: discarded.append(built.calibrator))
    reference = _result("fp32")
    tolerances = reference_tolerances(reference, GATE)

    def judged(built):
        result = _result(figures[built.calibrator])
        score = Score(result.accuracy.overall.drops["cosine"], {}, 0.0)
        return score, judge(reference, result, GATE, tolerances)

    spec = VariantSpec(name="int8", precision="int8", calibrator="auto")
    ctx = BuildContext(tmp_path / "model.onnx", tmp_path / "models")
    chosen, built, score, note = explain._auto_calibrated(spec, ctx, judged, GATE)
    assert built.calibrator == chosen.calibrator
    return chosen, score, note, discarded


def test_explain_prefers_a_resolved_pass_to_an_unresolved_one_with_a_smaller_drop(monkeypatch, tmp_path):
    """minmax has the smallest drop, but its pass rests on rows too spread to resolve the tolerance; entropy's is
    resolved. The old choice (the smallest drop) explained minmax, a calibrator the sweep would not keep."""
    chosen, score, note, discarded = _explain_auto(monkeypatch, tmp_path, {c: c for c in FIGURES if c != "fp32"})
    assert chosen.calibrator == "entropy" and score.overall == pytest.approx(0.003)
    assert sorted(discarded) == ["dynamic", "minmax", "percentile"]
    assert note.startswith("calibrator auto: explained with entropy, the smallest cosine drop of those whose pass the "
                           "rows resolve")  # fmt: skip
    assert "minmax +0.0005✓?" in note and "entropy +0.0030✓" in note and "percentile +0.0300✗" in note


def test_explain_keeps_an_unresolved_pass_only_when_none_is_resolved_and_says_why(monkeypatch, tmp_path):
    """No calibrator's pass is resolved: the smallest drop among the passes is kept, and the note says its pass rests
    on too few rows, with the rule's numbers; a breaching calibrator is never preferred to a pass."""
    figures = {"minmax": "dynamic", "entropy": "minmax", "percentile": "percentile", "dynamic": "dynamic"}
    chosen, _, note, _ = _explain_auto(monkeypatch, tmp_path, figures)
    assert chosen.calibrator == "entropy"
    assert "none on enough rows to resolve the tolerance" in note and "interval of the drop reaches" in note
