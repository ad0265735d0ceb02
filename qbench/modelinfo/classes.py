"""Which class each column of a score output stands for, when the graph says so.

Converters state it in two ways, both facts of the graph rather than guesses:

- an ONNX-ML classifier (LinearClassifier, TreeEnsembleClassifier, SVMClassifier) scores its
  classes in the order of its `classlabels_ints` / `classlabels_strings` attribute;
- a network picks its label as `classes[ArgMax(scores)]`: an ArrayFeatureExtractor or Gather
  on a constant table, indexed by the arg-max over the scores' last axis.

A score output may reach the graph output through maps that keep the columns and their order
(Identity, Cast, Normalizer, Sqrt, Exp, Log, Sigmoid, Softmax, a shift by one constant or a scale by one positive
constant, as onnxmltools multiplies a LightGBM classifier's scores by 1, and a row's shift or scale by a statistic
of that row's scores: minus their log-sum-exp, over their sum). scikit-learn's classes [1, 2, 5] then
read column 2 as class 5, where reading the labels as column ids would score class 1 as column 1 and
fail silently on data lacking class 5.

A string label output is read through the same tables: the classifier's, or the constant it is
looked up in; each value stands for its position there.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    import onnx

ClassTable = tuple[int | str, ...]

# element-wise or row-wise maps that keep each column's class and the columns' order
_FLOAT_TYPES = (1, 10, 11, 16)  # TensorProto FLOAT, FLOAT16, DOUBLE, BFLOAT16
_COLUMN_KEEPING_OPS = ("Identity", "Cast", "Normalizer", "Sqrt", "Exp", "Log", "Sigmoid", "Softmax", "LogSoftmax")
_ROW_NORMALISING_OPS = ("Sub", "Div")
_INDEX_OPS = ("Identity", "Cast", "Reshape", "Squeeze", "Unsqueeze", "Flatten")
_LABEL_ATTRIBUTES = ("classlabels_ints", "classlabels_int64s", "classlabels_strings")


@dataclass(frozen=True)
class ScoreFacts:
    """What the graph states about its score outputs (graph output name -> ...).

    tables: each column's class. labels: the class table a label output picks its values from (an ONNX-ML
    classifier's first output, or a constant table indexed by the graph), so that a string label reads as its
    position there. off_label: why the graph's own label is not the highest score (its label is
    the ArgMin of the scores, as KMeans' distances; or an SVMClassifier's one-vs-one vote), for scores whose
    arg-max would misread the model's decision. lowest_wins: the scores whose label is their ArgMin, so that their
    arg-min is the model's decision."""

    tables: dict[str, ClassTable]
    labels: dict[str, ClassTable]
    off_label: dict[str, str]
    probabilities: dict[str, bool]  # True: Sigmoid/Softmax made the scores; False: a linear layer (logits); see _scale
    log_probabilities: set[str]  # scores that are the log of probabilities (Log of a Sigmoid, LogSoftmax)
    id_counts: dict[str, int]  # an integer output made by ArgMax over an axis of static size: how many class ids
    lowest_wins: set[str]
    cuts: dict[str, tuple[float, bool]]  # a single score column the graph's label splits: (value, a tie is class 1)


def keys_are_columns(keys: ClassTable) -> bool:
    """Whether a {class: score} map's keys are its score matrix's column numbers: non-negative integers, so that the
    arg-max is the class itself. Other keys (strings, or integers such as -1 / +1) take their sorted position, and
    labels naming them are read through that table."""
    return all(isinstance(k, int) and not isinstance(k, bool) and k >= 0 for k in keys)


def score_facts(model: onnx.ModelProto) -> ScoreFacts:
    """The class tables and off-label scores of every tensor output whose graph states them."""
    graph = model.graph
    producers = {out: node for node in graph.node for out in node.output}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    constants = _constant_tables(model)
    fixed = _constant_tensors(model)
    scalars = _scalar_constants(model)
    tables, labels, off_label, probabilities, logs, lowest = {}, {}, {}, {}, set(), set()
    for output in graph.output:
        label_table = _label_table(output.name, producers, constants)
        if label_table:
            labels[output.name] = label_table
        chain = _score_chain(output.name, producers, scalars)
        table = _classifier_labels(chain[-1], producers) or _argmax_lookup(chain, consumers, constants)
        if table:
            tables[output.name] = table
        reason = _off_label(chain, producers, consumers)
        if reason:
            off_label[output.name] = reason
        if _labelled_by_argmin(chain, consumers):
            lowest.add(output.name)
        scale = _scale(output.name, producers, fixed)
        if scale is not None:
            probabilities[output.name] = scale
        if _log_of_probabilities(output.name, producers, fixed):
            logs.add(output.name)
    cuts = {}
    labels_out = {o.name for o in graph.output if o.type.tensor_type.elem_type not in _FLOAT_TYPES}
    for output in graph.output:
        cut = _decision_cut(output.name, consumers, scalars, labels_out)
        if cut is not None:
            cuts[output.name] = cut
    return ScoreFacts(tables, labels, off_label, probabilities, logs, _argmax_id_counts(model, producers), lowest, cuts)


# comparison of (score, constant) -> whether a score equal to the constant falls on the upper class (class 1);
# with the operands the other way round the comparison is mirrored
_CUT_INCLUSIVE = {"Less": True, "GreaterOrEqual": True, "Greater": False, "LessOrEqual": False}
_MIRRORED = {"Less": "Greater", "Greater": "Less", "LessOrEqual": "GreaterOrEqual", "GreaterOrEqual": "LessOrEqual"}


def _decision_cut(
    name: str, consumers: dict[str, list[onnx.NodeProto]], scalars: dict[str, float], labels: set[str]
) -> tuple[float, bool] | None:
    """Where the graph splits the scores `name` (through reshapes) into its label by comparing them with one
    constant (skl2onnx's IsolationForest: label = Less(scores, 0) -> -1, else 1), as (constant, whether a score equal
    to it is the upper class); None where no such comparison reads them, or several disagree. Only a comparison
    whose result goes on to a non-float graph output (`labels`) is the label's: another is a flag of its own."""
    found: set[tuple[float, bool]] = set()
    for tensor, waiting in each_once(name):
        for user in consumers.get(tensor, []):
            if user.op_type in _RESHAPING_OPS and user.input[0] == tensor:
                waiting.extend(user.output)
            elif user.op_type in _CUT_INCLUSIVE and user.domain in ("", "ai.onnx") and len(user.input) == 2:
                first = user.input[0] == tensor
                other = user.input[1] if first else user.input[0]
                if other in scalars and _reaches(user.output[0], consumers, labels):
                    found.add((scalars[other], _CUT_INCLUSIVE[user.op_type if first else _MIRRORED[user.op_type]]))
    return found.pop() if len(found) == 1 else None


def _reaches(name: str, consumers: dict[str, list[onnx.NodeProto]], targets: set[str]) -> bool:
    """Whether `name` flows (through any nodes) into one of `targets` within _SCALE_STEPS tensors."""
    for step, (tensor, waiting) in enumerate(each_once(name), 1):
        if tensor in targets:
            return True
        if step == _SCALE_STEPS:
            break
        waiting.extend(out for user in consumers.get(tensor, []) for out in user.output)
    return False


def each_once(start: str) -> Iterator[tuple[str, list[str]]]:
    """A graph walk from the tensor `start`: each tensor reached, once, depth first, with the list of tensors still
    to visit, which the walker extends with those it reaches from there."""
    waiting, seen = [start], set()
    while waiting:
        tensor = waiting.pop()
        if tensor not in seen:
            seen.add(tensor)
            yield tensor, waiting


def _constants(model: onnx.ModelProto) -> dict[str, onnx.TensorProto]:
    """The main graph's constant tensors by name: initializers and Constant nodes' values."""
    tensors = {t.name: t for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Constant" and node.output:
            value = next((a.t for a in node.attribute if a.name == "value"), None)
            if value is not None:
                tensors[node.output[0]] = value
    return tensors


def _scalar_constants(model: onnx.ModelProto) -> dict[str, float]:
    """Finite float constants of one value (initializers and Constant nodes): a threshold beside the scores."""
    import numpy as np
    from onnx import TensorProto, numpy_helper

    tensors = _constants(model)
    found = {}
    for name, tensor in tensors.items():
        if int(np.prod(tensor.dims, dtype=np.int64)) == 1 and tensor.data_location != TensorProto.EXTERNAL:
            value = numpy_helper.to_array(tensor)
            if value.dtype.kind == "f" and np.isfinite(value).all():
                found[name] = float(value.reshape(-1)[0])
    return found


def _log_of_probabilities(name: str, producers: dict[str, onnx.NodeProto], constants: set[str]) -> bool:
    """Whether `name` is made, through reshapes, as a LogSoftmax or as the Log of probabilities (a Log of a Sigmoid,
    torch's logsigmoid; of a Softmax, or of either plus a small constant): scores on neither a probability's scale
    nor a logit's."""
    node = producers.get(name)
    for _ in range(_SCALE_STEPS):
        if node is None or node.domain not in ("", "ai.onnx"):
            return False
        if node.op_type == "LogSoftmax":
            return True
        if node.op_type == "Log":
            return bool(node.input) and _scale(node.input[0], producers, constants) is True
        if node.op_type not in _RESHAPING_OPS or not node.input:
            return False
        node = producers.get(node.input[0])
    return False


_PROBABILITY_OPS = ("Sigmoid", "Softmax")
_LINEAR_OPS = ("MatMul", "Gemm", "Conv", "ConvTranspose", "Einsum")  # a linear layer (a contraction): raw logits
_RESHAPING_OPS = ("Identity", "Cast", "Reshape", "Squeeze", "Unsqueeze", "Flatten")
# element-wise combinations traced through: a bias, a temperature, an average of several heads' scores
_ELEMENTWISE_OPS = ("Add", "Sub", "Mul", "Div", "Sum", "Mean", "Max", "Min")
_SCALE_STEPS = 64  # nodes looked at before the graph is taken to say nothing
# ops that bound scores without changing what they are: a Clip of probabilities (kept off 0 for a log) is probabilities
_SCALE_KEEPING_OPS = ("Clip",)
# ONNX-ML classifiers' transforms of their scores: each makes probabilities; NONE leaves them as the model computes
# them (a forest's averaged votes, a linear SVM's margins), which the graph does not say
_ML_PROBABILITY_TRANSFORMS = (b"SOFTMAX", b"LOGISTIC", b"SOFTMAX_ZERO", b"PROBIT")
_ML_CLASSIFIERS = ("LinearClassifier", "TreeEnsembleClassifier", "SVMClassifier")


def _ml_scale(node: onnx.NodeProto, tensor: str) -> bool | str | None:
    """An ONNX-ML node's word on the scale of its output `tensor`: True (a classifier's scores through a probability
    transform), the input to read on through (a ZipMap or a Normalizer keeps its input's scale), or None."""
    if node.op_type in ("ZipMap", "Normalizer") and node.input:
        return node.input[0]
    if node.op_type in _ML_CLASSIFIERS and len(node.output) > 1 and tensor == node.output[1]:
        transform = next((a.s for a in node.attribute if a.name == "post_transform"), b"NONE")
        return True if transform in _ML_PROBABILITY_TRANSFORMS else None
    return None


def _scale(name: str, producers: dict[str, onnx.NodeProto], constants: set[str]) -> bool | None:
    """Whether the graph makes `name` as probabilities (True) or as logits (False), or None when it does not say:
    a one-column binary score is then read from its values (all within [0, 1]: a probability).

    The walk goes back through reshapes and element-wise arithmetic (their constant operands left aside) to where
    each score is made: a Sigmoid or Softmax (probabilities), a linear layer (logits), anything else (unknown). An
    Add is thus a linear output only as a bias onto a linear layer, and an average of sigmoids is a probability.
    Branches that disagree, or one that ends anywhere else, leave the scale unstated."""
    found: set[bool | None] = set()
    for step, (tensor, waiting) in enumerate(each_once(name), 1):
        node = producers.get(tensor)
        if node is not None and node.domain == "ai.onnx.ml":
            ml = _ml_scale(node, tensor)
            if ml is None:
                return None
            if isinstance(ml, str):
                waiting.append(ml)
            else:
                found.add(ml)
        elif node is None or node.domain not in ("", "ai.onnx") or step > _SCALE_STEPS:
            return None
        elif node.op_type in _PROBABILITY_OPS:
            found.add(True)
        elif node.op_type in _LINEAR_OPS and (node.op_type != "Einsum" or len(node.input) > 1):
            found.add(False)  # an Einsum of one operand sums or transposes it: no layer of its own
        elif node.op_type in (*_RESHAPING_OPS, *_SCALE_KEEPING_OPS) and node.input:
            waiting.append(node.input[0])
        elif node.op_type in _ELEMENTWISE_OPS:
            operands = [i for i in node.input if i and i not in constants]
            if not operands:
                return None  # a constant output: no scores
            waiting.extend(operands)
        else:
            return None
        if len(found) > 1:
            return None
    return found.pop() if len(found) == 1 else None


def _constant_tensors(model: onnx.ModelProto) -> set[str]:
    """Tensors that hold the same value for every row: initializers, Constant nodes, and reshapes or casts of
    them (a bias or a scale beside the scores)."""
    names = {t.name for t in model.graph.initializer} - {i.name for i in model.graph.input}
    for node in model.graph.node:
        if node.op_type == "Constant" or (node.op_type in _RESHAPING_OPS and node.input and node.input[0] in names):
            names.update(node.output)
    return names


def _off_label(chain: list[str], producers: dict[str, onnx.NodeProto],
               consumers: dict[str, list[onnx.NodeProto]]) -> str | None:
    """Why the model's label is not the arg-max of the scores in `chain`, or None."""
    if _labelled_by_argmin(chain, consumers):
        return "the graph's label is the ArgMin of these scores (lower is better, e.g. distances to cluster centres)"
    if any(node.op_type == "SVMClassifier" and node.domain == "ai.onnx.ml" for node in _ancestors(chain[0], producers)):
        return ("they come from an SVMClassifier, whose label is a "
                "one-vs-one vote the highest score does not always match")
    return None


def _labelled_by_argmin(chain: list[str], consumers: dict[str, list[onnx.NodeProto]]) -> bool:
    return any(user.op_type == "ArgMin" and _axis(user) in (1, -1) for name in chain
               for user in consumers.get(name, []))


def _ancestors(name: str, producers: dict[str, onnx.NodeProto]) -> list[onnx.NodeProto]:
    """Every node `name` is computed from."""
    found: dict[int, onnx.NodeProto] = {}
    waiting = [name]
    while waiting:
        node = producers.get(waiting.pop())
        if node is not None and id(node) not in found:
            found[id(node)] = node
            waiting.extend(node.input)
    return list(found.values())


def _score_chain(name: str, producers: dict[str, onnx.NodeProto], scalars: dict[str, float]) -> list[str]:
    """`name` and the tensors it copies column for column, back to where the scores are made."""
    chain = [name]
    while (node := producers.get(chain[-1])) is not None and node.input:
        scores = node.input[0] if node.op_type in _COLUMN_KEEPING_OPS or _row_normalised(node, producers) else None
        scores = scores or _order_kept(node, scalars)
        if scores is None or scores in chain:
            break
        chain.append(scores)
    return chain


def _order_kept(node: onnx.NodeProto, scalars: dict[str, float]) -> str | None:
    """The scores `node` shifts by one constant or scales by one positive constant (each column keeps its class and
    the columns their order), or None: scores + c, c + scores, scores - c, scores * c, c * scores, scores / c."""
    if node.domain not in ("", "ai.onnx") or len(node.input) != 2:
        return None
    first, second = node.input
    positive = {name for name, value in scalars.items() if value > 0}
    if node.op_type in ("Add", "Mul"):
        operands = scalars if node.op_type == "Add" else positive
        return first if second in operands and first not in scalars else second if first in operands else None
    if node.op_type in ("Sub", "Div"):
        return first if second in (scalars if node.op_type == "Sub" else positive) else None
    return None


def _row_normalised(node: onnx.NodeProto, producers: dict[str, onnx.NodeProto]) -> bool:
    """Whether `node` shifts or scales each row of scores by a statistic of that row (scores - logsumexp(scores),
    scores / sum(scores)): a Sub or Div whose second input is a Reduce over its first, through reshapes."""
    if node.op_type not in _ROW_NORMALISING_OPS or len(node.input) != 2:
        return False
    name = node.input[1]
    for _ in range(len(_RESHAPING_OPS)):
        statistic = producers.get(name)
        if statistic is None or not statistic.input:
            return False
        if statistic.op_type.startswith("Reduce"):
            return statistic.input[0] == node.input[0]
        if statistic.op_type not in _RESHAPING_OPS:
            return False
        name = statistic.input[0]
    return False


def _classifier_labels(scores: str, producers: dict[str, onnx.NodeProto]) -> ClassTable | None:
    """The class labels of the ONNX-ML classifier whose second output (the scores) is `scores`."""
    node = producers.get(scores)
    if node is None or node.domain != "ai.onnx.ml" or len(node.output) < 2 or node.output[1] != scores:
        return None
    return _class_labels(node)


def _class_labels(node: onnx.NodeProto) -> ClassTable | None:
    for attribute in node.attribute:
        if attribute.name in _LABEL_ATTRIBUTES and (attribute.ints or attribute.strings):
            return tuple(int(k) for k in attribute.ints) or tuple(k.decode() for k in attribute.strings)
    return None


def _label_table(name: str, producers: dict[str, onnx.NodeProto],
                 constants: dict[str, ClassTable]) -> ClassTable | None:
    """The classes the label output `name` is one of: the labels of the ONNX-ML classifier whose first output it
    copies, or the constant table it is looked up in (through reshapes and casts)."""
    for _ in range(len(_INDEX_OPS) * 4):
        node = producers.get(name)
        if node is None:
            return None
        if node.domain == "ai.onnx.ml" and node.output[0] == name and node.op_type.endswith("Classifier"):
            return _class_labels(node)
        if node.op_type in ("ArrayFeatureExtractor", "Gather") and len(node.input) == 2 and node.input[0] in constants:
            return constants[node.input[0]]
        if node.op_type not in _INDEX_OPS or not node.input:
            return None
        name = node.input[0]
    return None


def _argmax_lookup(
    chain: list[str], consumers: dict[str, list[onnx.NodeProto]], constants: dict[str, ClassTable]
) -> ClassTable | None:
    """The constant table indexed by ArgMax over the last axis of any tensor in `chain`."""
    for scores in chain:
        for argmax in consumers.get(scores, []):
            if argmax.op_type != "ArgMax" or _axis(argmax) not in (1, -1):
                continue
            index = argmax.output[0]
            for _ in range(len(_INDEX_OPS) * 4):  # a short chain of reshapes and casts at most
                users = consumers.get(index, [])
                lookup = next((u for u in users if u.op_type in ("ArrayFeatureExtractor", "Gather")
                               and len(u.input) == 2 and u.input[1] == index and u.input[0] in constants),
                               None)  # fmt: skip
                if lookup is not None:
                    return constants[lookup.input[0]]
                passing = [u for u in users if u.op_type in _INDEX_OPS]
                if len(passing) != 1:
                    break
                index = passing[0].output[0]
    return None


def _argmax_id_counts(model: onnx.ModelProto, producers: dict[str, onnx.NodeProto]) -> dict[str, int]:
    """Integer graph outputs that are ArgMax over an axis (through reshapes and casts) -> that axis's static size."""
    from onnx import TensorProto

    picks: dict[str, onnx.NodeProto] = {}
    for output in model.graph.output:
        if output.type.tensor_type.elem_type not in (TensorProto.INT64, TensorProto.INT32):
            continue
        node = producers.get(output.name)
        while node is not None and node.op_type in _INDEX_OPS and node.input:
            node = producers.get(node.input[0])
        if node is not None and node.op_type == "ArgMax":
            picks[output.name] = node
    if not picks:
        return {}
    shapes = _static_shapes(model)
    counts = {}
    for name, argmax in picks.items():
        shape = shapes.get(argmax.input[0])
        if shape:
            size = shape[_axis(argmax) % len(shape)]
            if size is not None and size > 0:
                counts[name] = size
    return counts


def _static_shapes(model: onnx.ModelProto) -> dict[str, tuple[int | None, ...]]:
    """Every tensor's shape ONNX's shape inference can tell (None for a dynamic dimension); {} when it fails."""
    from qbench.onnx_read import infer_shapes

    try:
        inferred = infer_shapes(model)
    except Exception:  # noqa: BLE001 - custom ops, a malformed graph: nothing known
        return {}
    graph = inferred.graph
    shapes = {}
    for value in [*graph.input, *graph.value_info, *graph.output]:
        if value.type.WhichOneof("value") == "tensor_type" and value.type.tensor_type.HasField("shape"):
            shapes[value.name] = tuple(d.dim_value if d.HasField("dim_value") else None
                                       for d in value.type.tensor_type.shape.dim)  # fmt: skip
    return shapes


def _axis(node: onnx.NodeProto) -> int:
    return next((a.i for a in node.attribute if a.name == "axis"), 0)


def _constant_tables(model: onnx.ModelProto) -> dict[str, ClassTable]:
    """1-D integer or string constants (initializers and Constant nodes): candidate class tables."""
    from onnx import TensorProto, numpy_helper

    tensors = _constants(model)
    tables: dict[str, ClassTable] = {}
    for name, tensor in tensors.items():
        if len(tensor.dims) != 1 or tensor.data_location == TensorProto.EXTERNAL:
            continue
        if tensor.data_type == TensorProto.STRING:
            tables[name] = tuple(s.decode() for s in tensor.string_data)
        elif tensor.data_type in (TensorProto.INT64, TensorProto.INT32):
            tables[name] = tuple(int(v) for v in numpy_helper.to_array(tensor))
    return tables
