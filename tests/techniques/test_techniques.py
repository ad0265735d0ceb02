"""The technique and calibrator registries: every entry resolves, a new technique is one config + one entry,
and the flat variant fields map onto the typed configs as before."""

from __future__ import annotations

from typing import ClassVar

import pytest
from pydantic import ValidationError

from qbench.recipe.spec import VariantSpec
from qbench.techniques import CALIBRATORS, TECHNIQUES, Calibration, Technique, TechniqueConfig, calibrator_names
from qbench.techniques.linear import LinearInt8, SmoothQuant
from qbench.techniques.modelopt import Modelopt
from qbench.techniques.onnxruntime import OrtDynamic, OrtStatic
from qbench.techniques.options import PerChannel
from qbench.techniques.qat import Qat
from qbench.variants import build_variant
from qbench.variants.base import BuildContext, BuiltVariant, technique_of


def test_every_technique_has_a_config_and_a_handler_that_resolve() -> None:
    assert TECHNIQUES.names() == sorted(
        ["bf16", "fp16", "fp32", "fp8", "linear", "modelopt", "ort-dynamic", "ort-static", "qat", "smoothquant"]
    )
    for name in TECHNIQUES:
        entry = TECHNIQUES.get(name)
        assert issubclass(entry.config, TechniqueConfig) and entry.config.precisions and entry.config.label
        assert callable(entry.builder()), name


@pytest.mark.parametrize(
    ("fields", "technique", "config_type"),
    [
        ({"precision": "int8", "calibrator": "entropy"}, "ort-static", OrtStatic),
        ({"precision": "int8", "calibrator": "auto"}, "ort-static", OrtStatic),
        ({"precision": "int8", "calibrator": "dynamic"}, "ort-dynamic", OrtDynamic),
        ({"precision": "int8", "calibrator": "minmax", "smoothquant": {}}, "smoothquant", SmoothQuant),
        ({"precision": "int8", "calibrator": "minmax", "technique": "linear"}, "linear", LinearInt8),
        ({"precision": "int8", "calibrator": "minmax", "qat": {}}, "qat", Qat),
        ({"precision": "int8", "calibrator": "minmax", "quantizer": "modelopt"}, "modelopt", Modelopt),
        (
            {"precision": "int8", "calibrator": "minmax", "quantizer": "modelopt", "smoothquant": {}},
            "modelopt",
            Modelopt,
        ),
        ({"precision": "int8", "calibrator": "minmax", "quantizer": "onnxruntime"}, "ort-static", OrtStatic),
        ({"precision": "fp16"}, "fp16", TECHNIQUES.get("fp16").config),
    ],
)
def test_the_flat_fields_imply_the_technique(fields: dict, technique: str, config_type: type) -> None:
    spec = VariantSpec(name="v", **fields)
    assert spec.technique_name == technique and type(spec.technique_config) is config_type


def test_typed_configs_resolve_defaults_per_technique() -> None:
    static = VariantSpec(name="s", precision="int8", calibrator="percentile", percentile=99.9).technique_config
    assert static.calibration.percentile == 99.9 and static.calibration.num_bins == 2048 and static.per_channel is False
    assert static.calibration.params() == {"calibrator": "percentile", "percentile": 99.9, "num_bins": 2048}
    smoothed = VariantSpec(name="q", precision="int8", calibrator="minmax", smoothquant={}).technique_config
    assert smoothed.per_channel is True  # the weights carry the moved outliers
    modelopt = VariantSpec(name="m", precision="fp8", calibrator="minmax", quantizer="modelopt").technique_config
    assert modelopt.per_channel is None and modelopt.precision == "fp8"


def test_a_copy_with_changed_fields_gets_its_technique_again() -> None:
    spec = VariantSpec(name="s", precision="int8", calibrator="auto", fallback={"max_excluded": 2})
    copy = spec.model_copy(update={"calibrator": "dynamic", "fallback": None})
    assert copy.technique_name == "ort-dynamic" and copy.technique_config.fallback is None


def test_an_explicit_technique_must_build_the_precision_and_be_registered() -> None:
    with pytest.raises(ValidationError, match="technique: 'linear' builds int8 variants, not fp8"):
        VariantSpec(name="l", precision="fp8", calibrator="minmax", technique="linear")
    with pytest.raises(ValidationError, match="got 'linaer', expected one of .* \\(did you mean 'linear'\\?\\)"):
        VariantSpec(name="l", precision="int8", calibrator="minmax", technique="linaer")
    with pytest.raises(ValidationError, match="smoothquant: does not apply to linear variants"):
        VariantSpec(name="l", precision="int8", calibrator="minmax", technique="linear", smoothquant={})


def test_a_new_technique_is_one_config_and_one_registry_entry(monkeypatch, tmp_path) -> None:
    class Rounded(TechniqueConfig):
        precisions: ClassVar[tuple[str, ...]] = ("int8",)
        label: ClassVar[str] = "rounded"
        calibration: Calibration
        per_channel: PerChannel = True

    def build_rounded(spec: VariantSpec, ctx: BuildContext) -> BuiltVariant:
        config = technique_of(spec, Rounded)
        params = {"per_channel": config.per_channel, "calibrator": config.calibration.calibrator}
        return BuiltVariant(spec.name, "int8", ctx.reference_path, params=params)

    monkeypatch.setattr(TECHNIQUES, "_entries", dict(TECHNIQUES._entries))
    TECHNIQUES.register("rounded", Technique(Rounded, build_rounded))
    spec = VariantSpec(name="r", precision="int8", calibrator="minmax", technique="rounded", per_channel=False)
    built = build_variant(spec, BuildContext(reference_path=tmp_path / "model.onnx", workdir=tmp_path))
    assert built.params == {"per_channel": False, "calibrator": "minmax"}
    with pytest.raises(ValidationError, match="exclude_nodes: does not apply to rounded variants"):
        VariantSpec(name="r", precision="int8", calibrator="minmax", technique="rounded", exclude_nodes=["n"])
    with pytest.raises(ValueError, match="already registered"):
        TECHNIQUES.register("rounded", Technique(Rounded, "somewhere:else"))


def test_one_calibrator_object_serves_onnxruntime_modelopt_and_torchao() -> None:
    from onnxruntime.quantization import CalibrationMethod

    assert calibrator_names("int8") == ["auto", "dynamic", "entropy", "minmax", "percentile"]
    assert calibrator_names("fp8") == ["entropy", "minmax", "percentile"]
    for name in ("minmax", "entropy", "percentile"):
        calibrator = CALIBRATORS.get(name)
        assert calibrator.computes_ranges and CalibrationMethod[calibrator.onnxruntime]
        assert calibrator.modelopt and calibrator.torchao_observer
    assert not CALIBRATORS.get("dynamic").computes_ranges and CALIBRATORS.get("dynamic").torchao_observer is None
    with pytest.raises(ValidationError, match="QAT starts from one calibration: choose entropy, minmax or percentile"):
        VariantSpec(name="q", precision="int8", calibrator="dynamic", qat={})


def test_fields_added_later_stay_out_of_the_dump_at_their_defaults() -> None:
    """Results record the variant dump and the recipe fingerprint hashes it: an old recipe keeps its fingerprint."""
    plain = VariantSpec(name="s", precision="int8", calibrator="minmax", smoothquant={"alpha": 0.6})
    dump = plain.model_dump(mode="json")
    assert "technique" not in dump and "keep_float" not in dump
    assert dump["smoothquant"] == {"alpha": 0.6, "unfoldable": "mul"}
    chosen = VariantSpec(name="s", precision="int8", calibrator="minmax", technique="linear", keep_float=["masks"])
    assert chosen.model_dump(mode="json")["technique"] == "linear" and chosen.model_dump()["keep_float"] == ["masks"]
    assert VariantSpec.model_validate(chosen.model_dump()) == chosen


def test_keep_float_rules_are_checked_when_the_recipe_loads() -> None:
    with pytest.raises(ValidationError, match="got 'mask', expected a rule .* \\(did you mean 'masks'\\?\\)"):
        VariantSpec(name="k", precision="int8", calibrator="minmax", keep_float=["mask"])
    with pytest.raises(ValidationError, match="keep_float: does not apply to QAT variants"):
        VariantSpec(name="k", precision="int8", calibrator="minmax", qat={}, keep_float=["Softmax"])
    assert VariantSpec(
        name="k", precision="fp8", calibrator="minmax", keep_float=["Softmax", "Softmax"]
    ).keep_float == ["Softmax"]
