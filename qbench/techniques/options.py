"""The option types that techniques share: declared once, used by the recipe's flat variant fields and by
the technique configs alike (so a type, a bound or a description never differs between the two).

Also the blocks that are a technique's own options (`qat:`, `smoothquant:`, `fallback:`) and the
float-keeping rules (`keep_float:`).
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
    model_validator,
)

from qbench.errors import did_you_mean, short_repr
from qbench.recipe.filters import check_filter


class StrictConfig(BaseModel):
    """Strict: `true` is not a number, "10" is not an int, 1.0 is not an int; unknown keys are errors."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


Filter = Annotated[dict[str, Any], Field(description="column -> value, or column -> {op: value}")]
# numpy's generators take a non-negative seed (a negative one fails only when the sweep draws), torch's one below 2^64
Seed = Annotated[int, Field(ge=0, le=2**63 - 1, description="random seed: a non-negative integer")]

# -- the flat variant options ------------------------------------------------------------------

PerChannel = Annotated[bool, Field(description="per-channel weight scales")]
ReduceRange = Annotated[
    bool | Literal["auto"],
    Field(description="7-bit weights; auto = on for x86 CPUs without VNNI (avoids u8s8 saturation)"),
]
ActivationType = Literal["uint8", "int8"]
WeightType = Literal["int8", "uint8"]
OpTypes = Annotated[list[str], Field(description="op types to quantize; default: the quantizer's")]
ExcludeNodes = Annotated[list[str], Field(description="node names kept in floating point")]

# keep_float: a rule name (lower case, below) or an ONNX op type (e.g. Softmax)
FLOAT_RULES = {
    "attention_matmuls": "MatMul/Gemm whose two inputs are both computed (attention scores and context)",
    "masks": "attention masks (from non-float inputs, causal masks from shapes, float additive-mask inputs) "
             "and the nodes that apply them",
}
_OP_TYPE = re.compile(r"[A-Z][A-Za-z0-9]*")


def _check_float_rules(rules: list[str]) -> list[str]:
    for rule in rules:
        if rule not in FLOAT_RULES and not _OP_TYPE.fullmatch(rule):
            raise ValueError(
                f"got {short_repr(rule)}, expected a rule ({', '.join(FLOAT_RULES)}) or an ONNX op type such as "
                f"Softmax{did_you_mean(rule, FLOAT_RULES)}"
            )
    return list(dict.fromkeys(rules))


KeepFloat = Annotated[
    list[str],
    AfterValidator(_check_float_rules),
    Field(
        description="nodes kept in floating point BY RULE: attention_matmuls, masks, or an op type (e.g. Softmax); "
        "matched on the FP32 graph, recorded in the variant's params"
    ),
]


class FallbackSpec(StrictConfig):
    until: Literal["gate"] = "gate"
    max_excluded: int = Field(8, gt=0, description="most nodes kept in floating point before giving up")
    step: int = Field(1, gt=0, description="nodes excluded per step")
    keep: Literal["fp32"] = Field("fp32", description="precision the excluded nodes keep")


# -- QAT ---------------------------------------------------------------------------------------


class TrainSpec(StrictConfig):
    filter: Filter | None = None
    limit: int | None = Field(None, gt=0, description="train on at most this many rows")

    _check = field_validator("filter")(lambda v: None if v is None else check_filter(v))


class QatSpec(StrictConfig):
    epochs: int = Field(3, gt=0)
    lr: float = Field(1.0e-4, gt=0)
    batch_size: int = Field(64, gt=0)
    train: TrainSpec = Field(TrainSpec(), description="rows to fine-tune on")
    loss: Literal["label", "distill"] = Field(
        "label", description="label: cross-entropy on data.label; distill: match the FP32 model's outputs"
    )
    seed: Seed = 0


# -- SmoothQuant -------------------------------------------------------------------------------

AUTO_ALPHAS = (0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)


def _check_alpha(value: Any) -> Any:
    """One clear message for SmoothQuant's alpha, instead of one per branch of `float | "auto"`."""
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if value == "auto" or (number and 0 <= value <= 1):
        return value
    raise ValueError(f"expected a number from 0 to 1, or 'auto'; got {short_repr(value)}")


# a SmoothQuant alpha: a number in [0, 1], or auto (chosen per Linear input); also the INT8 search's `alphas`
Alpha = Annotated[float | Literal["auto"], BeforeValidator(_check_alpha)]


def _check_alphas(values: list[float]) -> list[float]:
    if not values or any(not 0 <= value <= 1 for value in values):
        raise ValueError(f"expected a non-empty list of numbers from 0 to 1, got {short_repr(values)}")
    return sorted(set(values))


class SmoothQuantSpec(StrictConfig):
    """SmoothQuant's own options (the `smoothquant:` block of a variant)."""

    alpha: Alpha = Field(
        0.5,
        description="migration strength: 0 keeps the activations' range, 1 moves it all into the weights; "
        "auto: per Linear input, the alpha of `alphas` (or none) whose INT8 outputs are closest to FP32",
    )
    alphas: Annotated[list[Annotated[float, Field(strict=False)]], AfterValidator(_check_alphas)] = Field(
        list(AUTO_ALPHAS), description="the alphas `alpha: auto` tries per Linear input (plus no smoothing)"
    )
    fold: bool = Field(
        True, description="fold the smoothing into the producer (LayerNorm scale/bias, Linear, Mul/Add by a constant) "
        "where the graph allows; false always inserts a Mul (same outputs, slower)"
    )  # fmt: skip
    unfoldable: Literal["mul", "skip"] = Field(
        "mul",
        description="when the smoothing cannot fold into the producer: insert one Mul, or leave that input unsmoothed",
    )

    @model_validator(mode="after")
    def _options_fit(self) -> SmoothQuantSpec:
        if not self.fold and self.unfoldable == "skip":
            raise ValueError("unfoldable: 'skip' applies only with fold: true (fold: false inserts a Mul everywhere)")
        if "alphas" in self.model_fields_set and self.alpha != "auto":
            raise ValueError("alphas: applies only with alpha: auto")
        return self

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return without_later_defaults(handler(self), {"alphas": list(AUTO_ALPHAS), "fold": True})


def without_later_defaults(data: dict[str, Any], later: dict[str, Any]) -> dict[str, Any]:
    """`data` without the fields added after results were first recorded that hold their defaults, so that a
    recipe not using them keeps its fingerprint (its results stay current)."""
    return {key: value for key, value in data.items() if key not in later or value != later[key]}
