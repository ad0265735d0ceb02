"""The recipe's execution sections: where a sweep's jobs run (`executor:`) and what each backend's jobs need.

    executor:
      kind: ray                  # local (default: this process, no Ray) | ray
      address: auto              # ray: a running cluster (`auto`, `ray://head:10001`, `host:6379`); null starts
                                 # a local one on this machine
      store: s3://bucket/qbench  # where built variants are kept by content, for every node (default: a folder
                                 # next to the recipe's runs); a path or an fsspec URI
      retries: 2                 # a job whose worker died is run again at most this many times
      timeout_s: 3600            # ray: a job still running this long on its worker fails (default null: none)
    backends:
      - onnxruntime-cpu
      - {name: torch-cuda, accelerator: H100}   # GPU jobs of this backend run only on H100s

A backend entry may be a name or `{name, accelerator}`; the recipe keeps the names in `backends` and the
pins in `backend_resources`, so everything else reads `backends` as a list of names.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

EXECUTOR_KINDS = ("local", "ray")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class ExecutorSpec(_Strict):
    """How the sweep's jobs run."""

    kind: Literal["local", "ray"] = Field(
        "local", description="local: in this process, in order; ray: on a Ray cluster"
    )
    address: str | None = Field(
        None,
        description="ray: the cluster to join ('auto', 'ray://host:10001'); null: a local one",
    )
    store: str | None = Field(
        None,
        description="built variants by content: a folder or an fsspec URI all nodes reach",
    )
    retries: int = Field(
        2,
        ge=0,
        le=10,
        description="runs of a job again after its worker died (not after its own error)",
    )
    timeout_s: float | None = Field(
        None,
        gt=0,
        description="ray: seconds a job may run on its worker before it fails (its worker ended); null: no limit",
    )

    @model_validator(mode="after")
    def _timeout_on_ray(self) -> ExecutorSpec:
        if self.timeout_s is not None and self.kind != "ray":
            raise ValueError("timeout_s applies to `kind: ray` only (a job in the sweep's own process cannot be "
                             "ended without the sweep: bound a local sweep by its CI job's timeout)")
        return self


class BackendResources(_Strict):
    """What one backend's jobs ask the cluster for beyond its device (a GPU for GPU backends)."""

    accelerator: str | None = Field(None, description="Ray accelerator type the GPU must be: H100, L4, A100, ...")


def split_backend_entries(data: Any) -> Any:
    """Raw recipe data with `backends` entries written as `{name, accelerator}` turned into names, their
    options moved to `backend_resources` (before validation, so both spellings give one recipe)."""
    if not isinstance(data, dict) or not isinstance(data.get("backends"), list):
        return data
    entries = data["backends"]
    if not any(isinstance(entry, dict) for entry in entries):
        return data
    names: list[Any] = []
    resources: dict[str, Any] = dict(data.get("backend_resources") or {})
    for index, entry in enumerate(entries):
        if not isinstance(entry, dict):
            names.append(entry)
            continue
        unknown = sorted(set(entry) - {"name", "accelerator"})
        if "name" not in entry or unknown:
            what = f"unknown key {unknown[0]!r}" if unknown else "no 'name'"
            raise ValueError(f"backends[{index}]: {what}; expected a backend name or {{name, accelerator}}")
        names.append(entry["name"])
        options = {k: v for k, v in entry.items() if k != "name"}
        if options:
            resources[str(entry["name"])] = options
    return {**data, "backends": names, "backend_resources": resources}


def check_backend_resources(resources: dict[str, BackendResources], backends: list[str]) -> None:
    """Each pinned backend is one of the recipe's, and an accelerator is pinned only on a GPU backend."""
    from qbench.backends import BACKENDS
    from qbench.backends.base import needs_gpu
    from qbench.errors import expected_one_of

    for name, options in resources.items():
        if name not in backends:
            raise ValueError(f"backend_resources: {expected_one_of(name, backends)}")
        if options.accelerator is not None and not needs_gpu(BACKENDS.get(name)):
            raise ValueError(f"backends: {name} runs on CPU: an accelerator applies only to GPU backends")


def with_executor(recipe: Any, *, kind: str | None = None, address: str | None = None) -> Any:
    """`recipe` with its executor overridden from the command line (`--executor`, `--address`)."""
    if kind is None and address is None:
        return recipe
    if kind is not None and kind not in EXECUTOR_KINDS:
        from qbench.errors import QbenchError, expected_one_of

        raise QbenchError(f"--executor: {expected_one_of(kind, list(EXECUTOR_KINDS))}")
    update: dict[str, Any] = {}
    if kind is not None:
        update["kind"] = kind
    if address is not None:
        update["address"] = address
        update.setdefault("kind", "ray")
    return recipe.model_copy(update={"executor": recipe.executor.model_copy(update=update)})
