"""The recipe's `registry:` section: which of the gate's winners go to the MLflow Model Registry, and under what.

    registry:
      model: digits-cnn          # registered model name (one version per backend's winner)
      alias: candidate           # alias pointed at the new version (default: candidate)
      backends: null             # backends whose winner is registered; default: every backend of the recipe
      primary_batch_size: null   # the winner is the fastest (p50) passing variant at this latency batch size;
                                 # default: the smallest latency batch size (single-request serving)

`qbench gate` registers when the recipe has this section (or with `--register NAME`, which
overrides `model`; `--alias` overrides `alias`; `--no-register` skips it), and only when the gate
passes. The section does not decide the results: changing it never makes results stale.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from qbench.errors import QbenchError, expected_one_of

DEFAULT_ALIAS = "candidate"


def alias_problem(alias: str) -> str | None:
    """Why MLflow would refuse `alias` (None when it is fine): letters, digits, _ and -; not `latest` nor v<N>."""
    if not re.fullmatch(r"[\w-]+", alias) or alias.lower() == "latest" or re.fullmatch(r"[vV]\d+", alias):
        return f"got {alias!r}, expected letters, digits, '_' or '-' (not 'latest' nor a version name like 'v3')"
    return None


def model_name_problem(name: str) -> str | None:
    """Why `name` is no registered model name to use (None when it is fine): empty, surrounded by spaces (registered
    as typed, then never found by the name people type), or holding '/' or ':' (MLflow refuses them, after the gate)."""
    if not name.strip() or name != name.strip() or re.search(r"[/:]", name):
        return f"got {name!r}, expected a registered model name without '/' or ':' nor spaces around it"
    return None


class RegistrySpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    model: str = Field(min_length=1, description="MLflow registered model name")
    alias: str = Field(DEFAULT_ALIAS, description="alias pointed at the registered version")
    backends: list[str] | None = Field(None, description="backends whose winner is registered; default: all")
    primary_batch_size: int | None = Field(
        None, gt=0, description="winners are the fastest at this latency batch size; default: the smallest"
    )

    @field_validator("model", "alias")
    @classmethod
    def _name(cls, value: str, info: ValidationInfo) -> str:
        problem = (model_name_problem if info.field_name == "model" else alias_problem)(value)
        if problem is not None:
            raise ValueError(problem)
        return value

    def batch_size(self, latency_batch_sizes: Sequence[int]) -> int:
        """The primary batch size: the one given, else the smallest latency batch size."""
        return self.primary_batch_size if self.primary_batch_size is not None else min(latency_batch_sizes)


def check_registry(registry: RegistrySpec | None, backends: Sequence[str], batch_sizes: Sequence[int]) -> None:
    """Cross-field checks; raises ValueError('field: problem') for the recipe's error formatter."""
    if registry is None:
        return
    for backend in registry.backends or []:
        if backend not in backends:
            raise ValueError(f"registry.backends: {expected_one_of(backend, backends)} (the recipe's backends)")
    if registry.backends is not None and not registry.backends:
        raise ValueError("registry.backends: expected at least one backend, or null for every backend")
    size = registry.primary_batch_size
    if size is not None and size not in batch_sizes:
        raise ValueError(f"registry.primary_batch_size: got {size}, expected one of the latency batch sizes "
                         f"{', '.join(map(str, batch_sizes))}")  # fmt: skip


def check_registry_options(*, model: str | None, alias: str | None, skip: bool) -> None:
    """The command line's `--register NAME`, `--alias A`, `--no-register`, checked before anything runs."""
    if alias is not None and (problem := alias_problem(alias)) is not None:
        raise QbenchError(f"--alias: {problem}")
    if model is not None and (problem := model_name_problem(model)) is not None:
        raise QbenchError(f"--register: {problem}")
    if skip and (model is not None or alias is not None):
        raise QbenchError("--no-register: contradicts --register / --alias; give one or the other")


def requested_registry(
    section: RegistrySpec | None, *, model: str | None, alias: str | None, skip: bool
) -> RegistrySpec | None:
    """What to register: the recipe's section with `--register` / `--alias` over it; None when nothing is to be
    registered (`--no-register`, or neither a section nor `--register`)."""
    check_registry_options(model=model, alias=alias, skip=skip)
    if skip or (section is None and model is None):
        if alias is not None:
            raise QbenchError("--alias: needs --register NAME or a registry: section in the recipe")
        return None
    base = section if section is not None else RegistrySpec(model=model)  # type: ignore[arg-type]
    changes = {key: value for key, value in (("model", model), ("alias", alias)) if value is not None}
    return base.model_copy(update=changes)
