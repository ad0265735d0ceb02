"""The recipe's `variants:` entries: flat fields that name a precision and a technique's options.

    variants:
      - {name: int8, precision: int8, calibrator: minmax, per_channel: true, keep_float: [attention_matmuls]}
      - {name: sq, precision: int8, calibrator: minmax, smoothquant: {alpha: auto}}
      - {name: lin, precision: int8, technique: linear, calibrator: dynamic}

Each variant is built by one technique (`qbench.techniques`): the one named by `technique:`,
or the one its fields imply. The technique's config holds its options with their defaults and
checks; `VariantSpec.technique_config` gives it to the technique's handler.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, SerializerFunctionWrapHandler, model_serializer, model_validator

from qbench.errors import expected_one_of
from qbench.techniques import TECHNIQUES, TechniqueConfig, calibrator_names, technique_config
from qbench.techniques.calibrators import CALIBRATOR_OPTIONS, CALIBRATORS, calibrators_taking
from qbench.techniques.options import (
    ActivationType,
    ExcludeNodes,
    FallbackSpec,
    KeepFloat,
    OpTypes,
    PerChannel,
    QatSpec,
    ReduceRange,
    SmoothQuantSpec,
    StrictConfig,
    WeightType,
    without_later_defaults,
)

QUANTIZED_PRECISIONS = ("int8", "fp8")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]*")  # matched whole: `$` would let a final newline through
MAX_NAME_CHARS = 100  # names become file names with suffixes (<name>.calibration.json) and MLflow run names
# Models a build writes beside models/<name>.onnx as <name>.<tag>.onnx: FP16/BF16/FP8 emulations
# (qbench.variants.emulate), ModelOpt's TensorRT export (qbench.variants.modelopt_quant). A variant named
# '<another>.<tag>' would write its model where that variant's build writes one, each overwriting the other.
EMULATED_TAG, TRT_TAG = "emulated", "trt"


def _check_name(value: str) -> str:
    if not _NAME.fullmatch(value):
        raise ValueError(f"got {value!r}, expected letters, digits and _ . + - (starting with a letter or digit)")
    if len(value) > MAX_NAME_CHARS:
        raise ValueError(f"got a name of {len(value)} characters, expected at most {MAX_NAME_CHARS} (it names files)")
    tag = value.rpartition(".")[2]
    if "." in value and tag.casefold() in (EMULATED_TAG, TRT_TAG):
        raise ValueError(f"got {value!r}, expected a name not ending in .{EMULATED_TAG} or .{TRT_TAG}: "
                         f"models/{value}.onnx is where qbench writes the emulated or TensorRT model of a variant "
                         f"{value.rpartition('.')[0]!r}")
    return value


def check_case_apart(names: list[str]) -> None:
    """Variant names (the search's and 'fp32' among them) that differ only in case name files that one file on a
    case-insensitive file system (macOS, Windows): models/int8.onnx and models/INT8.onnx, jobs/build_fp32.json and
    jobs/build_FP32.json. A name given twice as written is the duplicate check's."""
    seen: dict[str, str] = {}
    for name in dict.fromkeys(names):
        other = seen.setdefault(name.casefold(), name)
        if other != name:
            raise ValueError(f"variants: {other!r} and {name!r} differ only in case; expected names that differ "
                             "whatever their case (each names files, which a case-insensitive file system such as "
                             "macOS's or Windows' holds as one)")


def _check_technique(value: str | None) -> str | None:
    if value is not None and value not in TECHNIQUES:
        raise ValueError(expected_one_of(value, TECHNIQUES.names()))
    return value


Name = Annotated[str, AfterValidator(_check_name)]
_LATER_FIELDS = {"technique": None, "keep_float": []}
# later fields whose explicit default means something: `keep_float: []` turns off static builds' default rules, so
# it must not serialise (fingerprint, build key) as a recipe that leaves keep_float out
_MEANT_WHEN_SET = ("keep_float",)
# the fields that are options of the technique (everything but the variant's identity and runtime form)
_NOT_OPTIONS = ("name", "precision", "technique", "compile")


class VariantSpec(StrictConfig):
    name: Name
    precision: Literal["fp32", "fp16", "bf16", "int8", "fp8"]
    technique: Annotated[str | None, AfterValidator(_check_technique)] = Field(
        None, description="the technique that builds it (see qbench.techniques); default: implied by the fields below"
    )
    calibrator: str | None = Field(
        None, description="int8: minmax | entropy | percentile | dynamic | auto; fp8: minmax | entropy | percentile"
    )
    percentile: float | None = Field(None, gt=0, le=100, description="percentile calibrator; default 99.999")
    num_bins: int | None = Field(None, gt=0, description="histogram bins (entropy, percentile); default 2048")
    num_quantized_bins: int | None = Field(None, gt=0, description="entropy target bins; default 128")
    per_channel: PerChannel = False
    reduce_range: ReduceRange = "auto"
    activation_type: ActivationType = "uint8"
    weight_type: WeightType = "int8"
    symmetric_activations: bool = False
    op_types: OpTypes | None = None
    exclude_nodes: ExcludeNodes = []
    keep_float: KeepFloat = []
    fallback: FallbackSpec | None = Field(
        None, description="int8: keep the costliest nodes in floating point until the gate holds"
    )
    quantizer: Literal["onnxruntime", "modelopt"] | None = Field(
        None, description="who quantizes (int8/fp8): onnxruntime (default) or modelopt (needs a PyTorch model)"
    )
    qat: QatSpec | None = Field(None, description="int8 only: fine-tune with fake quantization (needs a PyTorch model)")
    smoothquant: SmoothQuantSpec | None = Field(
        None, description="int8 with calibrator minmax (static) or dynamic: smooth, then quantize Linear inputs and "
        "weights only (per_channel defaults to true here); with quantizer modelopt: ModelOpt's SmoothQuant (alpha)"
    )  # fmt: skip
    compile: bool = Field(False, description="torch backends: run the module through torch.compile")

    @model_validator(mode="after")
    def _technique_fits(self) -> VariantSpec:
        if self.precision in QUANTIZED_PRECISIONS:
            allowed = calibrator_names(self.precision)
            if self.calibrator is None:
                raise ValueError(f"calibrator: {self.precision} needs one of {', '.join(allowed)}")
            if self.calibrator not in allowed:
                raise ValueError(f"calibrator: {expected_one_of(self.calibrator, allowed)} for {self.precision}")
            for option in CALIBRATOR_OPTIONS:
                if getattr(self, option) is not None and option not in CALIBRATORS.get(self.calibrator).options:
                    taking = " / ".join(calibrators_taking(option))
                    raise ValueError(f"{option}: applies to calibrator {taking}, not {self.calibrator!r}")
        self.technique_config  # noqa: B018 (derived now so that every problem is a load-time error)
        return self

    @property
    def technique_name(self) -> str:
        """The registered technique that builds this variant."""
        return technique_config(self.precision, self.technique, self._options())[0]

    @property
    def technique_config(self) -> TechniqueConfig:
        """This variant's options as its technique's typed config (defaults resolved)."""
        return technique_config(self.precision, self.technique, self._options())[1]

    def _options(self) -> dict[str, Any]:
        """The technique options this variant gives, in field order (None is 'not given', as in a copy that
        clears an option with model_copy)."""
        given = self.model_fields_set
        fields = [f for f in type(self).model_fields if f in given and f not in _NOT_OPTIONS]
        return {f: getattr(self, f) for f in fields if getattr(self, f) is not None}

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        later = {k: v for k, v in _LATER_FIELDS.items() if k not in _MEANT_WHEN_SET or k not in self.model_fields_set}
        return without_later_defaults(handler(self), later)


def reference_variant() -> VariantSpec:
    """The FP32 reference every sweep builds when the recipe does not list one."""
    return VariantSpec(name="fp32", precision="fp32")
