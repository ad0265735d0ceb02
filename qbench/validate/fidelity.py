"""What is timed, what is scored, and whether each figure is native or emulated.

A backend may declare the precisions it computes with their own kernels
(`native_precisions`, e.g. ONNX Runtime's CPU provider: fp32 and int8). A backend
that declares nothing is trusted to compute every precision it accepts. For one
variant on one backend:

- **native**: the variant's artifact is both timed and scored; both figures are native.
- **a simulation artifact** (`BuiltVariant.simulation`, the BF16 variant: an FP32 graph
  that rounds every tensor to bfloat16): timed and scored as it is, on every backend;
  both figures are emulated, since no backend runs that graph as BF16 hardware would.
- **a precision the backend cannot compute** (FP16 and FP8 on ONNX Runtime's CPU):
  - scored: the emulation registered for the precision (`qbench.variants.EMULATIONS`):
    for FP16 a graph that rounds every float16 tensor of the artifact to float16, so
    overflow gives inf and underflow 0 as on FP16 hardware (ORT's CPU provider would
    otherwise compute in FP32 and hide both); for FP8 the Q/DQ artifact itself, which
    already rounds and saturates every FP8 tensor. A precision with no registered
    emulation is scored as the backend computes it and still flagged emulated.
  - timed: the artifact, the file a user deploys: what this runtime does with it on
    this machine. It is flagged emulated because the runtime does not run the format's
    own kernels (FP16 is upcast to FP32 on CPU), so it is not the format's native
    speed. The emulation graph itself is never timed: its extra Casts would give a
    figure of a model nobody ships.

Both models are saved: `VariantResult.model_path` is the timed artifact and
`evaluated_model_path` the scored emulation when it is another file; each gives the
measured outputs under default ONNX Runtime session options.
"""

from __future__ import annotations

from dataclasses import dataclass

from qbench.backends.base import Backend, native_precisions
from qbench.results.schema import EMULATED, Fidelity
from qbench.variants import EMULATIONS, BuiltVariant
from qbench.variants.emulate import Emulation


@dataclass(frozen=True)
class MeasurementPlan:
    timed: BuiltVariant  # cold start and steady-state latency
    scored: BuiltVariant  # outputs for accuracy (the same object when nothing is emulated)
    fidelity: Fidelity

    @property
    def separate(self) -> bool:
        """True when the scored model is another file than the timed one."""
        return self.scored.onnx_path != self.timed.onnx_path


def plan_measurement(backend: Backend, built: BuiltVariant) -> MeasurementPlan:
    """Decide (and build, for FP16 on CPU) the timed and the scored model of `built` on `backend`."""
    if built.simulation:
        how = built.params.get("method", "a rounding graph")
        method = f"{built.precision.upper()} simulated by the model itself: {how}"
        return MeasurementPlan(built, built, Fidelity(EMULATED, EMULATED, method))
    native = native_precisions(backend)
    if native is None or built.precision in native:
        return MeasurementPlan(built, built, Fidelity())
    if built.precision in EMULATIONS:
        emulation = EMULATIONS.get(built.precision)(built)
    else:
        unfaithful = f"{built.precision} has no faithful emulation: scored as {backend.name} computes it"
        emulation = Emulation(built, unfaithful)
    return MeasurementPlan(built, emulation.scored, Fidelity(EMULATED, EMULATED, emulation.method))
