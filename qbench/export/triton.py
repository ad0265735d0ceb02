"""A Triton Inference Server model repository for one gated variant of a recipe's latest sweep.

    from qbench.export.triton import export_triton
    export = export_triton(load_recipe("recipes/digits.yaml"), "int8-entropy", "onnxruntime-cpu", Path("repo"))

writes `repo/<name>/config.pbtxt`, `repo/<name>/1/model.onnx` (the very file qbench measured) and
`repo/<name>/README.md` with the `perf_analyzer` commands that reproduce qbench's latency points.

Every qbench backend that runs the ONNX file maps onto Triton's ONNX Runtime backend
(platform `onnxruntime_onnx`). The `tensorrt` backend does too, with TensorRT as ONNX Runtime's
GPU execution accelerator rather than a `tensorrt_plan`: a serialized engine only loads on the
TensorRT version and GPU model that built it, while the ONNX file is what the sweep gated, and
ONNX Runtime builds the engine on the serving machine (the same Q/DQ graph, the same FP16 flag).

A variant is exported only when it passed the gate on results that match the recipe; anything
else (a breach, a failed or unjudged variant, a variant the gate does not apply to, FP32 on any backend, stale
results) is refused unless `force=True`.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import qbench
from qbench.errors import QbenchError, expected_one_of
from qbench.export.pbtxt import to_pbtxt
from qbench.export.perf_data import rows_file, write_input_data
from qbench.export.triton_config import (
    TARGETS,
    TritonTarget,
    batcher_sizes,
    fixed_batch_of,
    served_shapes,
    simulated_batcher,
    triton_config,
    unbatched_outputs,
)
from qbench.files import file_in_the_way, new_folder
from qbench.gate.evaluate import GateReport
from qbench.gate.run import run_gate
from qbench.modelinfo.signature import ModelInfo, external_data_files, read_model_info
from qbench.provenance import model_bytes, model_sha256
from qbench.recipe.spec import Recipe
from qbench.results.schema import LatencyPoint, SweepResults, VariantResult

DEFAULT_MAX_QUEUE_DELAY_US = 100
MODEL_FILE = "model.onnx"
CONFIG_FILE = "config.pbtxt"
README_FILE = "README.md"
# perf_analyzer's --input-data: the rows qbench timed (qbench.export.perf_data)
INPUT_DATA_FILE = "perf_input_data.json"
VERSION = "1"
GRPC_URL = "localhost:8001"

_MODEL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]*")
_MAX_NAME_CHARS = 255  # a folder name (NAME_MAX, in bytes: these characters are one byte each)


@dataclass(frozen=True)
class TritonExport:
    model_dir: Path
    config_path: Path
    model_path: Path
    readme_path: Path
    model_sha256: str
    gate_status: str
    forced: bool
    left_out: tuple[str, ...] = ()  # outputs config.pbtxt does not serve (`unbatched_outputs`)


@dataclass(frozen=True)
class GateVerdict:
    status: str  # "pass" | "fail" | "not gated" | "unusable" (results cannot be judged)
    reason: str


# -- gate -----------------------------------------------------------------------------------------


def gate_verdict(report: GateReport, variant: str, backend: str, *, reference: str) -> GateVerdict:
    """Whether `variant` on `backend` passed the gate, and if not, why (for the refusal line)."""
    key = f"{variant}@{backend}"
    general = [p for p in report.problems if not any(p.startswith(f"{g}:") for g in report.gated)]
    if general:
        return GateVerdict("unusable", general[0])
    status = report.status_of(variant, backend)
    if variant == reference and status != "fail":  # on every backend: the baseline, never a variant that passed
        return GateVerdict("not gated", _reference_reason(report, backend))
    if status == "not gated":
        return GateVerdict(status, "gate.applies_to does not match it")
    own_problems = [p.removeprefix(f"{key}: ") for p in report.problems if p.startswith(f"{key}:")]
    breaches = [c for c in report.breaches if c.variant == variant and c.backend == backend]
    if own_problems:
        return GateVerdict(status, own_problems[0])
    if breaches:
        worst = max(breaches, key=lambda c: c.drop - c.tolerance)
        where = worst.scope if worst.metric == report.metric and len(report.gated_metrics) == 1 else \
            f"{worst.scope} {worst.metric}"  # which metric, where several are gated or another check breached
        worst_text = f"worst {where}: drop {worst.drop:.4f} > {worst.tolerance:.4f}"
        return GateVerdict(status, f"{len(breaches)} breach(es), {worst_text}")
    # failed with its backend's FP32 alone: that FP32 differs from the first backend's, or cannot be judged
    inherited = [*filter(None, [report.fp32_differs().get(backend)]), *report.fp32_problems(backend)]
    return GateVerdict(status, inherited[0] if status == "fail" and inherited else "")


def _reference_reason(report: GateReport, backend: str) -> str:
    """Why FP32 is not exported as gated on `backend`: the first backend's is what the gate judges against; a later
    backend's is judged only for agreeing with it (where it does not, its verdict is 'fail'), which makes it that
    backend's reference, not a variant that stayed within a tolerance of one."""
    if report.reference_backend and backend != report.reference_backend:
        return (f"the FP32 reference; on this later backend it agrees with FP32 on {report.reference_backend}, which "
                "makes it this backend's reference, not a variant that passed")
    return "the FP32 reference"


def _refusal(key: str, verdict: GateVerdict) -> str:
    why = f" ({verdict.reason})" if verdict.reason else ""
    return (f"{key}: gate status '{verdict.status}'{why}; not exported: only variants that passed the gate are "
            "(--force overrides)")


# -- config.pbtxt ---------------------------------------------------------------------------------


# -- model file -----------------------------------------------------------------------------------


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _measured_model(measured: VariantResult) -> Path:
    """The ONNX file the sweep measured, checked to be there and of the size it had then."""
    if measured.model_path is None:
        raise QbenchError(f"{measured.key}: the results record no model file")
    path = Path(measured.model_path)
    if not path.is_file():
        raise QbenchError(f"{measured.key}: model file {path} (recorded in the results) is missing")
    if measured.model_bytes is not None and model_bytes(path) != measured.model_bytes:
        raise QbenchError(
            f"{measured.key}: model file {path} has {model_bytes(path)} bytes, the sweep measured "
            f"{measured.model_bytes}: it changed since; re-run `qbench sweep`"
        )
    if measured.model_sha256 is not None and model_sha256(path) != measured.model_sha256:
        raise QbenchError(f"{measured.key}: model file {path} is not the model the sweep measured (its sha256 "
                          "differs from the results'): it changed since; re-run `qbench sweep`")  # fmt: skip
    return path


def _copy_model(source: Path, version_dir: Path) -> Path:
    version_dir.mkdir()
    target = version_dir / MODEL_FILE
    shutil.copyfile(source, target)
    for location in external_data_files(source):
        (version_dir / location).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source.parent / location, version_dir / location)
    return target


# -- README ---------------------------------------------------------------------------------------


def _runs_per_window(point: LatencyPoint) -> int:
    """qbench's timed runs per closed timing window (all of them when it timed a fixed count)."""
    return point.iterations // max(1, len(point.window_p50_ms))


def load_command(name: str, measured: VariantResult) -> str | None:
    """The perf_analyzer command replaying qbench's load scenario at the SLO's rate (None without one): Poisson
    arrivals of single requests at that rate, as many requests as were simulated, p99 reported."""
    serving = measured.serving
    if serving is None or serving.at_rate is None or serving.rate_rps is None:
        return None
    rate = f"{serving.rate_rps:g}"
    return (f"perf_analyzer -m {name} -i grpc -u {GRPC_URL} -b 1 --async --request-rate-range {rate}:{rate}:1 "
            f"--request-distribution poisson --measurement-mode count_windows "
            f"--measurement-request-count {serving.at_rate.requests} --percentile=99{_DATA_FLAG}")  # fmt: skip


def queue_delay_us(measured: VariantResult) -> int:
    """The dynamic batcher's max queue delay: the one qbench's load scenario simulated, else the default."""
    serving = measured.serving
    if serving is None or serving.max_queue_delay_ms is None:
        return DEFAULT_MAX_QUEUE_DELAY_US
    return round(serving.max_queue_delay_ms * 1000)


def perf_analyzer_commands(name: str, measured: VariantResult, *, batched: bool = True) -> list[str]:
    """One perf_analyzer command per batch size qbench timed: concurrency 1, about as many timed
    requests per window as qbench's timing windows held (all its timed runs when it timed a fixed
    count), stability judged on p50, on the rows qbench timed (`INPUT_DATA_FILE`). Not `batched` (a fixed-batch model),
    a request holds the whole batch: -b 1; batched, only the sizes config.pbtxt's max_batch_size admits
    (`batcher_sizes`)."""
    if measured.latency is None:
        return []
    largest = batcher_sizes(measured)[0]
    return [
        f"perf_analyzer -m {name} -i grpc -u {GRPC_URL} -b {p.batch_size if batched else 1} --concurrency-range 1:1 "
        f"--measurement-mode count_windows --measurement-request-count {_runs_per_window(p)} --percentile=50"
        f"{_DATA_FLAG}"
        for p in measured.latency.points if not batched or p.batch_size <= largest
    ]


_DATA_FLAG = f" --input-data {INPUT_DATA_FILE}"


def _batcher_text(measured: VariantResult) -> str:
    """How config.pbtxt's dynamic batcher treats the requests of the commands above (see `batcher_sizes`)."""
    largest = batcher_sizes(measured)[0]
    if simulated_batcher(measured) is None:
        return ("Each of these batch sizes is a preferred batch size in config.pbtxt, so at concurrency 1 no request "
                "waits in the dynamic batcher's queue.")  # fmt: skip
    timed = [p.batch_size for p in measured.latency.points] if measured.latency is not None else []
    above = [str(bs) for bs in timed if bs > largest]
    text = (f"config.pbtxt's dynamic batcher is the load scenario's (max batch {largest}, the only preferred size), so "
            f"a request of fewer than {largest} rows waits the max queue delay for company before it runs: compare "
            "`compute infer`, not the end-to-end latency.")  # fmt: skip
    if above:
        sizes, are = (f"size {above[0]}", "is") if len(above) == 1 else (f"sizes {', '.join(above)}", "are")
        text += f" Batch {sizes} (timed by qbench) {are} above that max_batch_size: this configuration refuses them."
    return text


def _left_out_lines(info: ModelInfo) -> list[str]:
    left_out = unbatched_outputs(info)
    if not left_out:
        return []
    names = ", ".join(f"`{n}`" for n in left_out)
    return ["", f"config.pbtxt leaves out the model's output(s) {names}: without a batch (first) dimension (a scalar "
            "or a fixed length), they hold no rows for Triton's batcher to hand each request, and Triton's ONNX "
            "Runtime backend serves only the outputs its config lists."]  # fmt: skip


def _load_lines(name: str, measured: VariantResult, fixed: int | None) -> list[str]:
    """The README's section on qbench's load point (none without one): its figures and the perf_analyzer command
    replaying it, where config.pbtxt has the dynamic batcher it simulated. A model with a `fixed` batch has none
    (max_batch_size 0: each request must carry a whole batch), so Triton cannot gather single rows into its batches
    as qbench simulated, and the command, each request a whole batch at the rows' rate, would send `fixed` times the
    rows: no command is given, and the section says so."""
    serving = measured.serving
    load = load_command(name, measured)
    if load is None or serving is None or serving.at_rate is None:
        return []
    at_rate = serving.at_rate
    batcher = (f"max batch {serving.max_batch_size}, max queue delay {serving.max_queue_delay_ms:g} ms, "
               + (f"each batch filled up to the model's {fixed} rows" if fixed is not None else
                  "as in config.pbtxt unless overridden"))  # fmt: skip
    simulated = (f"qbench simulated Poisson arrivals of one row at {serving.rate_rps:g} req/s through a dynamic "
                 f"batcher ({batcher}) from the measured service times: p50 {at_rate.p50_ms:.3f} ms, p99 "
                 f"{at_rate.p99_ms:.3f} ms, mean batch "
                 f"{at_rate.mean_batch_size:.2f} over {at_rate.requests} requests.")  # fmt: skip
    if fixed is not None:
        return ["", "## qbench's load point", "", simulated +
                f" Triton cannot serve that load: config.pbtxt has no dynamic batcher (max_batch_size 0, as the model "
                f"takes batches of {fixed} rows only), so each request must carry a whole batch; replaying it would "
                f"send {fixed} times the rows. Export the model with a dynamic batch axis to serve single-row "
                "requests."]  # fmt: skip
    return ["", "## Reproduce qbench's load point", "",
            simulated + " The same load on the server:", "", "```",
            load, "```"]


def _readme(name: str, recipe: Recipe, results: SweepResults, measured: VariantResult, info: ModelInfo,
            verdict: GateVerdict, forced: bool, sha256: str, target: TritonTarget) -> str:  # fmt: skip
    latency = measured.latency
    threads = latency.threads if latency and latency.threads else "ONNX Runtime's default"
    lines = [
        f"# {name}: {measured.variant} of {recipe.name} for Triton Inference Server",
        "",
        f"Exported by qbench {qbench.__version__} from the sweep of {results.created_at}: variant "
        f"`{measured.variant}` ({measured.precision}) as measured on `{measured.backend}`.",
        # the metrics the verdict was judged on: the recipe's gate, which may gate others than the sweep's did
        f"Gate on {', '.join(recipe.gate.gated_metrics)}: **{verdict.status}**"
        + (f" ({verdict.reason})" if verdict.reason else "") + ".",
    ]
    if forced and verdict.status != "pass":
        lines += ["", "**Exported with --force: this variant did not pass the gate.**"]
    lines += [
        "",
        f"`{VERSION}/{MODEL_FILE}` is the file qbench measured ({measured.model_bytes} bytes, sha256 `{sha256}`).",
        f"Served by Triton's ONNX Runtime backend on {'a GPU' if target.instance_kind == 'KIND_GPU' else 'the CPU'}"
        + (", with TensorRT as its execution accelerator (ONNX Runtime builds the engine on the serving GPU on "
           "first load; a prebuilt plan would only load on the TensorRT version and GPU that built it)"
           if target.tensorrt else "") + ".",  # fmt: skip
        *_left_out_lines(info),
        "",
        "## Serve",
        "",
        "```",
        "tritonserver --model-repository <this folder's parent>",
        "```",
        "",
        "## Reproduce qbench's latency points",
        "",
        f"qbench timed one request at a time (concurrency 1); intra-op threads: {threads}.",
        "",
        "| batch | warm-up / timed runs | p50 ms | p99 ms | items/s |",
        "|---:|---:|---:|---:|---:|",
    ]
    lines += [f"| {p.batch_size} | {p.warmup} / {p.iterations} | "
              f"{p.p50_ms:.3f} | {p.p99_ms:.3f} | {p.items_per_s:,.1f} |"
              for p in (latency.points if latency else ())]  # fmt: skip
    where = "perf_analyzer ships in Triton's SDK image and the `perf-analyzer` package"
    lines += ["", f"With the server running ({where}), from this folder:", "", "```"]
    fixed = fixed_batch_of(info)
    lines += perf_analyzer_commands(name, measured, batched=fixed is None)
    batching = (_batcher_text(measured) if fixed is None else
                f"The model has a fixed batch of {fixed} (an input's static first dimension), so config.pbtxt does not "
                f"batch (max_batch_size 0): each request carries a whole batch of {fixed} rows.")  # fmt: skip
    lines += [
        "```",
        "",
        f"{batching} perf_analyzer's latency also counts the request's trip through the server "
        "(gRPC, copies); its server-side `compute infer` time is the figure to compare with qbench's p50.",
    ]
    lines += _load_lines(name, measured, fixed)
    lines += ["", f"`{INPUT_DATA_FILE}` holds a seeded sample of the recipe's evaluation rows (every combination of "
              "slices getting its share) as qbench fed them, each with its shape; "
              f"`{rows_file(Path(INPUT_DATA_FILE)).name}` names them (data table positions). perf_analyzer's default "
              "random bytes are no row of the data (an integer id of random bytes indexes past its table, and ONNX "
              "Runtime refuses the request)."]
    if measured.notes:  # e.g. a dynamic INT8 variant's accuracy depends on what the dynamic batcher puts together
        lines += ["", "## Notes from the sweep", "", *(f"- {note}" for note in measured.notes)]
    return "\n".join(lines) + "\n"


# -- export ---------------------------------------------------------------------------------------


def _model_name(given: str | None, default: str) -> str:
    """The model's name: `given` (--name) or `default`, refused in one line unless it is a folder name Triton loads
    as itself: a letter or digit first (no '', no leading dot: a hidden folder), then letters, digits and _ . + -
    (no space, no slash: a folder inside another; no newline, which `$` alone lets end a name)."""
    name = default if given is None else given
    if not _MODEL_NAME.fullmatch(name) or len(name) > _MAX_NAME_CHARS:
        where = "--name" if given is not None else "the default name <recipe>-<variant> (pass --name)"
        raise QbenchError(f"Triton model name, {where}: got {name!r}, expected a letter or digit, then letters, "
                          "digits and _ . + - (no spaces, slashes or "
                          f"leading dot), {_MAX_NAME_CHARS} characters at most")
    return name


def _find(results: SweepResults, variant: str, backend: str) -> VariantResult:
    measured = results.find(variant, backend)
    if measured is None:
        raise QbenchError(f"variant {expected_one_of(f'{variant}@{backend}', [v.key for v in results.variants])}")
    if measured.status != "ok":
        raise QbenchError(f"{measured.key}: {measured.status} in the sweep "
                          f"({measured.error}); there is nothing to export")
    return measured


def _check_destination(to: Path, name: str, overwrite: bool) -> None:
    """`to` is (or can become) a folder, and `to/name` is new, empty, or to be replaced (--overwrite)."""
    blocking = file_in_the_way(to)
    if blocking is not None:
        raise QbenchError(f"--to {to}: {blocking} is not a folder; expected a folder for the Triton model repository")
    model_dir = to / name
    if model_dir.exists() and any(model_dir.iterdir()) and not overwrite:
        raise QbenchError(f"{model_dir} already exists and is not empty (--overwrite replaces it)")


@contextlib.contextmanager
def _staged_model_dir(to: Path, name: str) -> Iterator[Path]:
    """A hidden folder beside `to/name` to write the export into; when the block ends without an error it becomes
    `to/name` (an earlier folder there is replaced, and deleted only then). Otherwise it is removed: an
    interrupted or failed export (a full disk, a signal) leaves no half-written model folder, and the earlier
    one as it was."""
    model_dir = to / name
    try:
        to.mkdir(parents=True, exist_ok=True)
        staging = new_folder(to, name, "partial")  # readable as the umask allows: the model folder is a server's
    except OSError as exc:
        raise QbenchError(f"--to {to}: cannot write the Triton model repository: {exc.strerror or exc}") from exc
    try:
        yield staging
        replaced = model_dir.with_name(f"{staging.name.removesuffix('.partial')}.replaced")
        if model_dir.exists():
            model_dir.rename(replaced)
        staging.rename(model_dir)
        shutil.rmtree(replaced, ignore_errors=True)
    except OSError as exc:
        raise QbenchError(f"{model_dir}: cannot write the Triton model: {exc.strerror or exc}") from exc
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def export_triton(
    recipe: Recipe,
    variant: str,
    backend: str,
    to: Path,
    *,
    force: bool = False,
    model_name: str | None = None,
    max_queue_delay_us: int | None = None,
    overwrite: bool = False,
    results_path: Path | None = None,
) -> TritonExport:
    """Write a Triton model repository entry for `variant` on `backend` from the recipe's latest results
    (or `results_path`); QbenchError when the variant did not pass the gate and `force` is False.
    max_queue_delay_us: the dynamic batcher's; default the one the sweep's load scenario simulated (`slo:`),
    else DEFAULT_MAX_QUEUE_DELAY_US."""
    if backend not in TARGETS:
        raise QbenchError(f"Triton export: backend {expected_one_of(backend, TARGETS)}")
    if max_queue_delay_us is not None and max_queue_delay_us < 0:
        raise QbenchError(f"max queue delay: got {max_queue_delay_us} µs, expected 0 or more")
    name = _model_name(model_name, f"{recipe.name}-{variant}")
    report, results = run_gate(recipe, results_path)
    measured = _find(results, variant, backend)
    verdict = gate_verdict(report, variant, backend, reference=results.reference)
    if verdict.status != "pass" and not force:
        raise QbenchError(_refusal(measured.key, verdict))
    source = _measured_model(measured)
    info = served_shapes(read_model_info(source), source)
    named = recipe.model.outputs or ([recipe.model.output] if recipe.model.output is not None else [])
    unbatched_outputs(info, named)  # refused where it would leave out an output the recipe evaluates
    target = TARGETS[backend]
    delay = max_queue_delay_us if max_queue_delay_us is not None else queue_delay_us(measured)
    config = to_pbtxt(triton_config(name, measured, info, target, max_queue_delay_us=delay))
    _check_destination(Path(to), name, overwrite)
    with _staged_model_dir(Path(to), name) as staging:
        sha256 = _sha256(_copy_model(source, staging / VERSION))
        (staging / CONFIG_FILE).write_text(config, encoding="utf-8")
        readme = _readme(name, recipe, results, measured, info, verdict, force, sha256, target)
        (staging / README_FILE).write_text(readme, encoding="utf-8")
        write_input_data(staging / INPUT_DATA_FILE, recipe, info, fixed_batch=fixed_batch_of(info))
    model_dir = Path(to) / name
    return TritonExport(model_dir, model_dir / CONFIG_FILE, model_dir / VERSION / MODEL_FILE, model_dir / README_FILE,
                        sha256, verdict.status, force, tuple(unbatched_outputs(info)))  # fmt: skip
