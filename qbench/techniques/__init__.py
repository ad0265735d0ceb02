"""Techniques: typed configs with one registered handler each, and the calibrators they use.

A variant's technique is named by its `technique:` field, or implied by its flat fields
(`qat:` → qat, `quantizer: modelopt` → modelopt, `smoothquant:` → smoothquant, otherwise the
precision's default: ORT static or dynamic INT8, FP8, or a float cast). `technique_config`
turns the fields into the technique's config, rejecting an option the technique does not take.

Adding a technique: a module with its `TechniqueConfig` subclass and handler, and ONE
`TECHNIQUES.register` line below. Importing this package imports no runtime.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from qbench.registry import Registry
from qbench.techniques.base import Technique, TechniqueConfig
from qbench.techniques.calibrators import CALIBRATOR_OPTIONS, CALIBRATORS, Calibration, Calibrator, calibrator_names
from qbench.techniques.floats import FloatCast
from qbench.techniques.fp8 import Fp8
from qbench.techniques.linear import LinearInt8, SmoothQuant
from qbench.techniques.modelopt import Modelopt
from qbench.techniques.onnxruntime import OrtDynamic, OrtStatic
from qbench.techniques.qat import Qat

TECHNIQUES: Registry[Technique] = Registry("technique")
TECHNIQUES.register("fp32", Technique(FloatCast, "qbench.variants.fp32:build_fp32"))
TECHNIQUES.register("fp16", Technique(FloatCast, "qbench.variants.fp16:build_fp16"))
TECHNIQUES.register("bf16", Technique(FloatCast, "qbench.variants.fp16:build_bf16"))
TECHNIQUES.register("ort-static", Technique(OrtStatic, "qbench.variants.int8:build_int8"))
TECHNIQUES.register("ort-dynamic", Technique(OrtDynamic, "qbench.variants.int8:build_int8"))
TECHNIQUES.register("linear", Technique(LinearInt8, "qbench.variants.linear_int8:build_linear_int8"))
TECHNIQUES.register("smoothquant", Technique(SmoothQuant, "qbench.variants.linear_int8:build_linear_int8"))
TECHNIQUES.register("fp8", Technique(Fp8, "qbench.variants.fp8:build_fp8"))
TECHNIQUES.register("qat", Technique(Qat, "qbench.variants.qat:build_qat"))
TECHNIQUES.register("modelopt", Technique(Modelopt, "qbench.variants.modelopt_quant:build_modelopt"))


def implied_technique(precision: str, fields: Mapping[str, Any]) -> str:
    """The technique a variant without a `technique:` field gets from its other fields."""
    if fields.get("qat") is not None:
        return "qat"
    if fields.get("quantizer") == "modelopt":
        return "modelopt"
    if fields.get("smoothquant") is not None:
        return "smoothquant"
    return _precision_default(precision, fields)


def _precision_default(precision: str, fields: Mapping[str, Any]) -> str:
    if precision == "int8":
        return "ort-dynamic" if fields.get("calibrator") == "dynamic" else "ort-static"
    return precision


def technique_config(precision: str, technique: str | None, fields: Mapping[str, Any]) -> tuple[str, TechniqueConfig]:
    """The technique's name and config from a variant's precision, `technique:` and the other fields it sets
    (in field order). Raises ValueError('field: message') for an option the technique does not take."""
    name = technique if technique is not None else implied_technique(precision, fields)
    config_class = TECHNIQUES.get(name).config
    if precision not in config_class.precisions:
        if technique is not None:
            raise ValueError(
                f"technique: {name!r} builds {' / '.join(config_class.precisions)} variants, not {precision}"
            )
        name = _precision_default(precision, fields)  # its own technique rejects the option that implied another
        config_class = TECHNIQUES.get(name).config
    options: dict[str, Any] = {}
    calibration: dict[str, Any] = {}
    for field, value in fields.items():
        target = "calibration" if field == "calibrator" or field in CALIBRATOR_OPTIONS else field
        if field in config_class.selectors and target not in config_class.model_fields:
            continue
        if target not in config_class.model_fields:
            raise ValueError(config_class.foreign_option(field, precision))
        if target == "calibration":
            calibration[field] = value
        else:
            options[field] = value
    if "precision" in config_class.model_fields:
        options["precision"] = precision
    try:
        if calibration:
            options["calibration"] = Calibration.model_validate(calibration)
        return name, config_class.model_validate(options)
    except ValidationError as exc:
        raise ValueError(_first_problem(exc)) from None


def _first_problem(exc: ValidationError) -> str:
    """'field: message' from a config's first validation error."""
    error = exc.errors(include_url=False)[0]
    detail = error.get("ctx", {}).get("error", error["msg"])
    where = ".".join(str(part) for part in error["loc"])
    return f"{where}: {detail}" if where else str(detail)


__all__ = [
    "CALIBRATORS",
    "TECHNIQUES",
    "Calibration",
    "Calibrator",
    "Technique",
    "TechniqueConfig",
    "calibrator_names",
    "implied_technique",
    "technique_config",
]
