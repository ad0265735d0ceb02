"""The recipe's `search:` section: find the fastest INT8 variant that passes the gate, within a time budget.

    search:
      name: int8-search          # the variant the search's choice becomes (gated like any variant)
      time_budget_s: 120         # the search ends within this (a step starts only if predicted to end in it)
      techniques: null           # which families to try; default: all (see qbench.search.candidates)
      alphas: [auto]             # SmoothQuant migration strengths tried (a number in [0, 1] or auto)
      max_keep_float: 8          # most nodes a keep-float candidate leaves in floating point
      screen_rows: 48            # evaluation rows of the cheap first pass (every slice represented)
      timing_runs: 5             # timed runs per batch size when a candidate's speed is estimated
      finalists: 3               # passing candidates re-timed side by side with FP32 before choosing
      batch_sizes: null          # the batch sizes candidates are timed and ranked at; default: every latency one

How the search works is in qbench.search.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, field_validator, model_serializer

from qbench.recipe.variants import Name
from qbench.techniques.options import Alpha, without_later_defaults

TECHNIQUES = ("ort-dynamic", "smoothquant-dynamic", "smoothquant-static", "ort-static")  # uncalibrated first


class SearchSpec(BaseModel):
    """An automatic INT8 search: candidates screened cheaply, the promising ones evaluated in full, the fastest passing
    kept."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    name: Name = Field("int8-search", description="the searched variant's name")
    time_budget_s: float = Field(
        120.0, gt=0, allow_inf_nan=False,
        description=("seconds the search ends within: a step starts only when predicted, from what the search "
                     "measured so far, to end within them, leaving room for the finalists' re-timing and the pick's "
                     "evaluation (a step outrunning its prediction, and those the search's rules require, may end "
                     "past them: its report says so)"),
    )
    techniques: list[Literal["ort-dynamic", "smoothquant-dynamic", "smoothquant-static", "ort-static"]] | None = Field(
        None, min_length=1, description="families of candidates to try; default: all"
    )
    alphas: list[Alpha] = Field(["auto"], min_length=1,
                                description="SmoothQuant alphas tried (auto: chosen per Linear input)")  # fmt: skip
    max_keep_float: int = Field(8, ge=0,
                                description="most nodes a keep-float candidate leaves in floating point (0: none)")
    screen_rows: int = Field(48, gt=0, description="evaluation rows of the cheap first pass")
    timing_runs: int = Field(5, gt=0, description="timed runs per batch size for a candidate's speed estimate")
    finalists: int = Field(3, ge=1, description="passing candidates re-timed side by side with FP32")
    batch_sizes: list[Annotated[int, Field(gt=0)]] | None = Field(
        None, min_length=1,
        description=("the latency batch sizes candidates are timed at and ranked by (the geometric mean of the "
                     "speed-ups there): the batch production serves at; default: every latency batch size"),
    )

    @field_validator("batch_sizes")
    @classmethod
    def _distinct(cls, sizes: list[int] | None) -> list[int] | None:
        repeated = sorted({size for size in sizes or () if sizes.count(size) > 1})
        if repeated:
            raise ValueError(f"batch size {repeated[0]} is listed twice; expected each batch size once")
        return sizes

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return without_later_defaults(handler(self), {"batch_sizes": None})  # earlier results keep their fingerprint

    @property
    def families(self) -> tuple[str, ...]:
        return tuple(self.techniques) if self.techniques is not None else TECHNIQUES


def check_search(search: SearchSpec | None, variant_names: list[str]) -> None:
    """The searched variant's name must be free (a recipe-level check, raised as the recipe's error)."""
    if search is not None and (search.name in variant_names or search.name == "fp32"):
        raise ValueError(f"search.name: {search.name!r} is already a variant's name")


def check_search_batches(search: SearchSpec | None, batch_sizes: Sequence[int]) -> None:
    """The search's batch sizes must be latency batch sizes (FP32's timings there are what it compares against)."""
    for size in (search.batch_sizes or ()) if search is not None else ():
        if size not in batch_sizes:
            raise ValueError(f"search.batch_sizes: got {size}, expected one of the latency batch sizes "
                             f"{', '.join(map(str, batch_sizes))}")
