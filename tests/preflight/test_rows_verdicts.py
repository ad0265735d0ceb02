"""The row-independence check's passes are kept (qbench.verdicts): a warm sweep of the same model on
the same rows does not run it again; another model file, other rows checked or a failed check run it every time."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import qbench.preflight.rows as preflight_rows
from qbench.errors import RecipeError
from tests.preflight.test_rows import CLASSES, FEATURES, RNG, _batch_centred, _check, _save

ROWS = RNG.normal(size=(20, FEATURES)).astype(np.float32)


@pytest.fixture
def sessions(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """The models the check opened an ONNX Runtime session on (each run of the check opens one), in a cache of the
    test's own."""
    monkeypatch.setenv("QBENCH_CACHE_DIR", str(tmp_path / "cache"))
    opened: list[Path] = []
    real = preflight_rows._session

    def counted(path: Path):  # noqa: ANN202 - as _session
        opened.append(path)
        return real(path)

    monkeypatch.setattr(preflight_rows, "_session", counted)
    return opened


def _linear(path: Path, scale: float = 1.0) -> Path:
    weight = numpy_helper.from_array(np.arange(FEATURES * CLASSES, dtype=np.float32).reshape(FEATURES, CLASSES) * scale,
                                     "w")  # fmt: skip
    return _save(path, [helper.make_node("MatMul", ["x", "w"], ["y"])],
                 [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", FEATURES])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", CLASSES])], [weight])  # fmt: skip


def _verdicts(tmp_path: Path) -> list[Path]:
    return sorted((tmp_path / "cache" / "checks").glob("row-independence-*.json"))


def test_a_passed_check_is_kept_and_not_run_again_on_the_same_model_and_rows(tmp_path: Path,
                                                                             sessions: list[Path]) -> None:  # fmt: skip
    """Before, every sweep ran the check again (MiniLM: 1.1-2.6 s of a warm sweep's preparation)."""
    model = _linear(tmp_path / "m.onnx")
    _check(tmp_path, model, {"x": ROWS})
    _check(tmp_path, model, {"x": ROWS.copy()})
    assert sessions == [model]
    [kept] = _verdicts(tmp_path)
    record = json.loads(kept.read_text())
    assert record["passed"] is True and record["rows"] == preflight_rows.CHECKED_ROWS
    assert any(file.endswith("preflight/rows.py") for file in record["code"])  # an edit to the check runs it again


def test_other_rows_checked_or_another_model_file_run_the_check_again(tmp_path: Path, sessions: list[Path]) -> None:
    model = _linear(tmp_path / "m.onnx")
    _check(tmp_path, model, {"x": ROWS})
    later_row = ROWS.copy()
    later_row[preflight_rows.CHECKED_ROWS] += 1.0  # a row the check does not feed: the same verdict
    _check(tmp_path, model, {"x": later_row})
    assert len(sessions) == 1
    checked_row = ROWS.copy()
    checked_row[0, 0] = np.nextafter(checked_row[0, 0], np.float32(np.inf))  # one bit of a row it feeds
    _check(tmp_path, model, {"x": checked_row})
    assert len(sessions) == 2
    _linear(model, scale=2.0)  # the same path, other weights
    _check(tmp_path, model, {"x": ROWS})
    assert len(sessions) == 3
    assert len(_verdicts(tmp_path)) == 3


def test_a_failed_check_is_never_kept(tmp_path: Path, sessions: list[Path]) -> None:
    model = _batch_centred(tmp_path / "m.onnx")
    for _ in range(2):
        with pytest.raises(RecipeError, match="when each of the same 8 rows was fed alone"):
            _check(tmp_path, model, {"x": ROWS})
    assert sessions == [model, model]
    assert _verdicts(tmp_path) == []


def test_other_weights_in_an_external_data_file_run_the_check_again(tmp_path: Path, sessions: list[Path]) -> None:
    """A big model keeps its weights beside the .onnx, whose own bytes (the tensors' offsets and lengths) stay the
    same when only the weights change."""
    model = tmp_path / "m.onnx"
    saved = []
    for scale in (1.0, 2.0):
        graph = onnx.load(str(_linear(tmp_path / "inline.onnx", scale)))
        (tmp_path / "m.data").unlink(missing_ok=True)  # onnx appends to an existing one
        onnx.save_model(graph, str(model), save_as_external_data=True, location="m.data", size_threshold=0)
        saved.append(model.read_bytes())
        _check(tmp_path, model, {"x": ROWS})
    assert saved[0] == saved[1]  # only m.data tells the two apart
    assert sessions == [model, model]


def test_a_verdict_that_cannot_be_kept_is_warned_about_naming_the_row_check(
    tmp_path: Path, sessions: list[Path], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A cache that cannot be written (its folder a file): the pass is not kept, and the warning names the check that
    runs again. It said 'the export check's verdict ... the next sweep checks the export again' of an ONNX model that
    no export made."""
    (tmp_path / "not-a-folder").write_text("")
    monkeypatch.setenv("QBENCH_CACHE_DIR", str(tmp_path / "not-a-folder"))
    model = _linear(tmp_path / "m.onnx")
    with caplog.at_level("WARNING", logger="qbench"):
        _check(tmp_path, model, {"x": ROWS})
    [warning] = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert "export" not in warning
    assert warning.endswith("; the next sweep runs the row-independence check on 8 evaluation rows again")
