"""Which variant `qbench explain` rebuilds: the recipe's, without its search or fallback, and for `calibrator: auto` the
calibrator the newest sweep kept (explain does not time, so it cannot redo that choice itself)."""

from __future__ import annotations

from qbench.errors import QbenchError, expected_one_of
from qbench.recipe.spec import Recipe, VariantSpec
from qbench.techniques.calibrators import AUTO_CALIBRATORS

EXPLAINED_TECHNIQUES = ("ort-static", "ort-dynamic", "linear", "smoothquant")


def explained_spec(recipe: Recipe, name: str) -> tuple[VariantSpec, list[str]]:
    """The recipe's variant as explain builds it: no search (`calibrator: auto` is chosen by qbench.explain)."""
    spec = next((v for v in recipe.variants if v.name == name), None)
    if spec is None:
        raise QbenchError(f"explain: variant {expected_one_of(name, [v.name for v in recipe.variants])}")
    if spec.technique_name not in EXPLAINED_TECHNIQUES:
        explained = ", ".join(EXPLAINED_TECHNIQUES)
        raise QbenchError(
            f"explain: {name!r} is a {spec.technique_name} variant; explain ranks the nodes that an INT8 build of the"
            f" FP32 graph quantizes ({explained}): explain a variant built by one of those"
        )
    notes = []
    if spec.fallback is not None:
        notes.append("fallback ignored: explaining the variant before any node is kept in FP32")
    return spec.model_copy(update={"fallback": None}), notes


def swept_calibrator(recipe: Recipe, name: str) -> tuple[str | None, str]:
    """The calibrator the recipe's newest sweep kept for `calibrator: auto` variant `name`, and where that was read;
    (None, why not) without complete, fresh results that say. The sweep keeps the fastest candidate passing the gate,
    which explain (it does not time) cannot redo: explaining another calibrator explains a variant nobody ships."""
    from qbench.gate.fresh import stale_inputs, stale_sections
    from qbench.gate.run import latest_results
    from qbench.provenance import recorded_recipe
    from qbench.results.schema import read_results

    try:
        path = latest_results(recipe)
        results = read_results(path)
        stale = stale_sections(recipe, recorded_recipe(results.recipe, path)) + stale_inputs(results, recipe)[0]
    except QbenchError:
        return None, "no complete sweep results of the recipe to take the sweep's choice from"
    if stale:
        return None, f"the newest sweep's results ({path}) are stale, so its choice was not followed"
    kept = {str(v.params["calibrator"]) for v in results.variants  # a torch form's results name no calibrator
            if v.variant == name and v.status == "ok" and "calibrator" in v.params}
    if len(kept) != 1 or not kept <= set(AUTO_CALIBRATORS):
        return None, f"the newest sweep ({path}) has no measured {name!r} to take the calibrator from"
    return kept.pop(), str(path)
