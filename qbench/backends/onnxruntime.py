"""ONNX Runtime as a qbench backend, for any execution provider.

A concrete backend is a subclass that names itself, its provider list and the
qbench extra that installs it (see onnxruntime_cpu.py). onnxruntime is imported
on first use, so a missing install surfaces as MissingExtraError, not ImportError.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from qbench.backends.base import RunOptions
from qbench.environment import timed_threads
from qbench.errors import MachineSetupError, MissingExtraError, QbenchError, expected_one_of
from qbench.per_call import fed_per_call, session_per_call_inputs
from qbench.variants.base import BuiltVariant

if TYPE_CHECKING:  # pragma: no cover
    import onnxruntime

_OPTIMIZATION_LEVELS = {
    "disable": "ORT_DISABLE_ALL",
    "basic": "ORT_ENABLE_BASIC",
    "extended": "ORT_ENABLE_EXTENDED",
    "all": "ORT_ENABLE_ALL",
}
DEFAULT_OPTIMIZATION_LEVEL = "all"


def _level_name(level: Any) -> str:
    """A GraphOptimizationLevel by the name recipes and results give it ("basic"...; ORT's own name if unknown)."""
    return next((name for name, ort_name in _OPTIMIZATION_LEVELS.items() if ort_name == level.name), level.name)


def _import_onnxruntime(extra: str) -> ModuleType:
    try:
        return importlib.import_module("onnxruntime")
    except ImportError:
        raise MissingExtraError("onnxruntime", extra) from None


_MISSING_LOCALE = re.compile(r"Failed to construct locale with name:([^:\s]+)")


def load_failure(variant: BuiltVariant, exc: Exception) -> QbenchError:
    """ONNX Runtime's refusal of `variant`'s model as one error. A StringNormalizer (skl2onnx's text vectorizers) whose
    locale this machine lacks (a container without en_US.UTF-8) is named with the fix: ONNX Runtime's own words end
    in a compiler's lambda name and a wish to 'install necessary language-pack-XX'."""
    missing = missing_locale(exc)
    return QbenchError(f"variant {variant.name}: onnxruntime cannot load {variant.onnx_path}: {missing or exc}")


def missing_locale(exc: BaseException) -> str | None:
    """What to do where ONNX Runtime refused a model because a StringNormalizer asks for a locale this machine lacks;
    None for any other refusal."""
    missing = _MISSING_LOCALE.search(str(exc))
    if missing is None:
        return None
    return (f"a StringNormalizer node asks for the locale {missing.group(1)!r}, which this machine does not have; "
            f"install it (e.g. `locale-gen {missing.group(1)}`) or give the node a locale attribute naming one that "
            "`locale -a` lists (C.UTF-8; a node without one, as skl2onnx writes it, asks for en_US.UTF-8)")  # fmt: skip


_ORT_PREFIX = re.compile(r"^\[ONNXRuntimeError\] : \d+ : \w+ : (Load model from .*? failed:)?")
_SOURCE_LOCATION = re.compile(r"\S+\.(?:cc|cpp|h|hpp):\d+ ")


def runtime_reason(exc: BaseException) -> str:
    """ONNX Runtime's own words for a refusal, on one line, without what only its developers read: the status prefix,
    the 'Load model from PATH failed:' the message names anyway, and the C++ source location and function signature
    (`model.cc:256 onnxruntime::Model::Model(onnx::ModelProto&&, ...)`) that precede the reason."""
    text = _ORT_PREFIX.sub("", " ".join(str(exc).split()))
    located = _SOURCE_LOCATION.search(text)
    if located is None:
        return text or type(exc).__name__
    rest = text[located.end():]
    signature = re.match(r"(?:[\w:<>*&]+ ){0,3}[\w:~<>]+\(", rest)  # `void ns::Class::Method(`
    if signature is not None:  # skip to the parenthesis that closes the signature (its types nest parentheses)
        depth = 0
        for index, char in enumerate(rest[signature.end() - 1:], signature.end() - 1):
            depth += {"(": 1, ")": -1}.get(char, 0)
            if depth == 0:
                rest = rest[index + 1:]
                break
    return (text[:located.start()] + rest.strip()).strip().rstrip(".") or text


def _implemented_opsets(ort: ModuleType) -> dict[str, int]:
    """Domain ('ai.onnx' for ONNX's own) -> the newest operator set version `ort` has an operator of; empty where the
    build does not list its schemas."""
    state = importlib.import_module("onnxruntime.capi.onnxruntime_pybind11_state")
    schemas = getattr(state, "get_all_operator_schema", None)
    newest: dict[str, int] = {}
    for schema in schemas() if schemas is not None else ():
        domain = schema.domain or "ai.onnx"
        newest[domain] = max(newest.get(domain, 0), schema.since_version)
    return newest


def _load_errors() -> tuple[type[Exception], ...]:
    """ONNX Runtime's own exception types (Fail, InvalidGraph, NoSuchFile...; they derive from Exception)."""
    state = importlib.import_module("onnxruntime.capi.onnxruntime_pybind11_state")
    return tuple(v for v in vars(state).values() if isinstance(v, type) and issubclass(v, Exception))


def quiet_run_options(ort: ModuleType) -> onnxruntime.RunOptions:
    """Options for a run whose failure ONNX Runtime raises and qbench reports in one line: the runtime's own log of the
    failing kernel (a coloured `[E:onnxruntime ...] ExecuteKernel` block over two lines on stderr, the same reason the
    exception carries) is left out, where it preceded that line once for every run that failed (three times in a dry
    run). Only the run's logger is quietened: what a session logs as it loads (a provider's fallback) is not."""
    options = ort.RunOptions()
    options.log_severity_level = 4  # fatal only: every error of a run is raised
    return options


def quiet_runtime_log() -> None:
    """ONNX Runtime's process-wide log at errors only, for the sessions that set no log_severity_level of their own:
    those ONNX Runtime's tools make (its calibrators, in every INT8 and FP8 build and in `qbench explain`) and any
    of qbench's that leave it unset (range analysis). Their load warnings, an unused initializer removed or an output
    declared with other sizes than it computes, were printed in ANSI colour amid qbench's lines, once per session;
    qbench says what matters of them itself (a contradicted output declaration: qbench.modelinfo). Sessions that set
    a level keep it (the backends' errors only)."""
    try:
        import onnxruntime as ort
    except ImportError:  # no runtime, no log to quiet: the backends name the package to install
        return
    ort.set_default_logger_severity(3)


class OnnxRuntimeRunner:
    """One InferenceSession. describe() reads back what the session really uses, not what was asked."""

    def __init__(self, session: onnxruntime.InferenceSession, version: str, load_note: str | None = None,
                 run_options: onnxruntime.RunOptions | None = None) -> None:  # fmt: skip
        self._session: onnxruntime.InferenceSession | None = session
        self._version = version
        self._load_note = load_note  # how the session came to differ from what was asked (OnnxRuntimeBackend.load)
        self._run_options = run_options
        self._per_call = session_per_call_inputs(session)  # fed their rows' one value (qbench.per_call)

    def _live(self) -> onnxruntime.InferenceSession:
        if self._session is None:
            raise RuntimeError("this runner was closed")
        return self._session

    def run(self, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        return self._live().run(None, dict(fed_per_call(feeds, self._per_call)), self._run_options)

    def describe(self) -> dict[str, Any]:
        session = self._live()
        options = session.get_session_options()
        return {
            "runtime": "onnxruntime",
            "version": self._version,
            "providers": list(session.get_providers()),
            "intra_op_threads": options.intra_op_num_threads or None,  # None: the runtime's default (0 was asked)
            "graph_optimization_level": _level_name(options.graph_optimization_level),
        }

    def result_fields(self, description: Mapping[str, Any]) -> dict[str, Any]:
        """What the result says of the session beyond the variant's file: why it runs at a lower optimisation level."""
        return {"notes": (self._load_note,)} if self._load_note else {}

    def close(self) -> None:
        """Drop the session so its thread pool and memory go now, not at garbage collection."""
        self._session = None


class OnnxRuntimeBackend:
    """Loads a variant's ONNX file into an InferenceSession on `providers` (first = the one required)."""

    name: ClassVar[str]
    providers: ClassVar[tuple[str, ...]]
    extra: ClassVar[str]  # the qbench extra that installs an onnxruntime build with these providers
    native_precisions: ClassVar[frozenset[str] | None] = None  # None: every precision runs on its own kernels
    runtime_packages: ClassVar[tuple[str, ...]] = ("onnxruntime", "onnxruntime-gpu")  # either one provides it
    # what a missing provider asks to install (default: "onnxruntime with <provider>"), and how
    install_name: ClassVar[str | None] = None
    install_hint: ClassVar[str | None] = None

    @property
    def required_provider(self) -> str:
        return self.providers[0]

    def check_available(self) -> None:
        ort = _import_onnxruntime(self.extra)
        available = ort.get_available_providers()
        if self.required_provider not in available:
            found = f"this onnxruntime {ort.__version__} has {', '.join(available)}"
            raise MissingExtraError(
                self.install_name or f"onnxruntime with {self.required_provider}",
                self.extra,
                hint=f"{self.install_hint}; {found}" if self.install_hint else found,
            )

    def supports(self, variant: BuiltVariant) -> str | None:
        if not variant.onnx_path.is_file():
            return f"model file not found: {variant.onnx_path}"
        return None

    def session_options(self, variant: BuiltVariant, options: RunOptions) -> onnxruntime.SessionOptions:
        """Threads from the recipe (unset: qbench.environment.default_threads, not ONNX Runtime's default, which
        counts the host's physical cores whatever the affinity mask and the cgroup quota allow); the graph
        optimisation level from the variant's session hints."""
        ort = _import_onnxruntime(self.extra)
        level = variant.session_hints.get("graph_optimization_level", DEFAULT_OPTIMIZATION_LEVEL)
        if level not in _OPTIMIZATION_LEVELS:
            expected = expected_one_of(level, _OPTIMIZATION_LEVELS)
            raise QbenchError(f"variant {variant.name}: session hint graph_optimization_level {expected}")
        session_options = ort.SessionOptions()
        session_options.intra_op_num_threads = timed_threads(options.threads)
        session_options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, _OPTIMIZATION_LEVELS[level])
        session_options.log_severity_level = 3  # errors only: ORT's warnings would interleave with qbench's output
        return session_options

    def load(self, variant: BuiltVariant, options: RunOptions) -> OnnxRuntimeRunner:
        """A runner for the variant; QbenchError if ORT rejects the model or runs it on another provider."""
        ort = _import_onnxruntime(self.extra)
        session_options = self.session_options(variant, options)
        note = None
        try:
            session = ort.InferenceSession(
                str(variant.onnx_path), sess_options=session_options, providers=list(self.providers)
            )
        except _load_errors() as exc:
            session, note = self._with_basic_optimisations(ort, variant, session_options, exc)
        runner = OnnxRuntimeRunner(session, ort.__version__, note, quiet_run_options(ort))
        in_use = session.get_providers()
        if not in_use or in_use[0] != self.required_provider:
            runner.close()
            raise QbenchError(
                f"{self.name}: onnxruntime fell back to {in_use[0] if in_use else 'no provider'} instead of "
                f"{self.required_provider} for variant {variant.name}; its timings would not be {self.name} timings"
            )
        return runner

    def implemented_opsets(self) -> dict[str, int]:
        """Domain -> the newest operator set version this ONNX Runtime has an operator of (empty if it does not say)."""
        return _implemented_opsets(_import_onnxruntime(self.extra))

    def check_loads(self, path: Path) -> None:
        """QbenchError saying why, when this ONNX Runtime cannot load the model at `path` on these providers (an IR
        version or operator set newer than it knows, an operator no provider implements): the preflight's check of
        the FP32 reference, before anything is built. Loaded at the basic optimisation level, the one `load` falls
        back to, so what fails here fails there too."""
        ort = _import_onnxruntime(self.extra)
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        options.log_severity_level = 4  # fatal only: the refusal is raised, in one line, rather than logged over two
        try:
            ort.InferenceSession(str(path), sess_options=options, providers=list(self.providers))
        except _load_errors() as exc:
            missing = missing_locale(exc)
            if missing is not None:  # the machine's lack, not the model's versions: the preflight adds no stamps
                raise MachineSetupError(
                    f"onnxruntime {ort.__version__} cannot load it on this machine: {missing}"
                ) from None
            raise QbenchError(f"onnxruntime {ort.__version__} cannot load it: {runtime_reason(exc)}") from None

    def _with_basic_optimisations(
        self, ort: ModuleType, variant: BuiltVariant, session_options: onnxruntime.SessionOptions, exc: Exception
    ) -> tuple[onnxruntime.InferenceSession, str]:
        """A session of `variant` at ONNX Runtime's basic optimisation level, after `exc` at a higher one, and the
        note saying so. The higher levels fuse nodes into ONNX Runtime's own kernels, and a fusion can reject a valid
        graph (1.30 fuses an FP8 Q/DQ MatMul into MatMulIntegerToFloat, which takes no float8 input); the basic level
        keeps the graph's own operators. Where the basic level fails too, or was already asked for, the graph itself is
        what ONNX Runtime rejects: `exc` stands."""
        failure = load_failure(variant, exc)
        asked = session_options.graph_optimization_level
        if asked.name in ("ORT_DISABLE_ALL", "ORT_ENABLE_BASIC"):
            raise failure from None
        session_options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        try:
            session = ort.InferenceSession(str(variant.onnx_path), sess_options=session_options,
                                           providers=list(self.providers))  # fmt: skip
        except _load_errors():
            raise failure from None
        why = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        level = _level_name(asked)
        return session, (f"onnxruntime {ort.__version__} could not load this graph at optimisation level {level} "
                         f"({why}): measured at level basic, so its latency is not what full optimisation would give")
