"""Extractive question answering (span): start and end scores per token, judged by the answer span they pick.

A QA model (Hugging Face's `*ForQuestionAnswering`) gives `start_logits` and `end_logits`, each (rows, tokens), for
a (question, context) pair. Its answer is neither arg-max alone: it is the span (start, end) of highest
start[start] + end[end] with start <= end, end - start < max_answer_tokens, both on the context's tokens. Judging
each output's arg-max on its own, over the question and the padding too, can call a variant that moved both ends by
one token 0 % or 100 % different depending on a position no answer can hold; this task decodes the span as it is
used and scores it.

The context's tokens are the pair's second text as the tokenizer encoded it (`tokenizer.pair`; its sequence ids,
SEQUENCE_IDS, 1: no [CLS], [SEP] nor padding), whatever inputs the model takes: a DistilBERT or RoBERTa QA model
takes no token_type_ids, and a span read over every attended token could start on the question or [CLS] (so does
Hugging Face's QA pipeline read it). Where the sequence ids are unknown (no `tokenizer.pair`, a slow tokenizer, feeds
given directly) they are the tokens with token_type_ids 1 and attention_mask 1 (the closing [SEP] included); without
token_type_ids either, every attended token (the question too).
Labels, optional, are one list per row, `[start, end]`: the answer's first and last token (inclusive) in the fed
pair's tokens, within the context. Without labels, exact_match and f1 are against FP32's span.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from qbench.errors import QbenchError
from qbench.modelinfo.signature import TensorMeta
from qbench.results.schema import SliceMetrics
from qbench.tasks.base import (
    SEQUENCE_IDS,
    LabelError,
    Task,
    container_problem,
    example_rows,
    is_float,
    mean_or_nan,
    no_label,
    wilson,
)
from qbench.validate import metrics
from qbench.validate.catalogue import MAX_ABS_ERROR, MetricInfo, share_of_rows

MAX_ANSWER_TOKENS = 30
"""The longest answer decoded, in tokens (Hugging Face's SQuAD example's max_answer_length), unless
task_options.max_answer_tokens says otherwise."""

NO_SPAN = -1
"""A row's span where none is decoded: no context token, or a row whose scores hold NaN/inf."""

CONTEXT_TYPE, MASK = "token_type_ids", "attention_mask"

SPAN_FIGURES = ("exact_match", "f1", "span_agreement", "span_f1")
"""The figures of the decoded spans: over the rows holding a context token (SpanRows.answerable)."""


def context_tokens(feeds: Mapping[str, np.ndarray], shape: tuple[int, int]) -> np.ndarray:
    """(rows, tokens) bool: where an answer may lie. The tokenizer's sequence ids == 1 (the pair's second text) where
    the feeds hold them; else token_type_ids == 1 where they hold those; and attention_mask == 1 where they hold it:
    without sequence ids and token_type_ids every attended token; without any of them every token."""
    allowed = np.ones(shape, dtype=bool)
    second_text = SEQUENCE_IDS if SEQUENCE_IDS in feeds else CONTEXT_TYPE
    for name, wanted in ((second_text, 1), (MASK, 1)):
        if name not in feeds:
            continue
        values = np.asarray(feeds[name])
        if values.shape != shape:
            what = "the tokenizer's sequence-id array" if name == SEQUENCE_IDS else f"input {name!r}"
            raise QbenchError(f"{what} has shape {list(values.shape)}, the start/end scores {list(shape)}: "
                              "expected one value per scored token")  # fmt: skip
        allowed &= values == wanted
    return allowed


def best_spans(start: np.ndarray, end: np.ndarray, allowed: np.ndarray, max_answer_tokens: int) -> np.ndarray:
    """(rows, 2) int64: each row's (start, end) of highest start + end score with start <= end, end - start <
    max_answer_tokens, both `allowed`; ties go to the shortest span, then the earliest. NO_SPAN for a row with no
    allowed token or NaN/inf scores on an allowed token (its decision cannot be read). Cost: rows x tokens x
    max_answer_tokens."""
    start, end = np.asarray(start, dtype=np.float64), np.asarray(end, dtype=np.float64)
    rows, tokens = start.shape
    best = np.full(rows, -np.inf)
    spans = np.full((rows, 2), NO_SPAN, dtype=np.int64)
    for length in range(min(max_answer_tokens, tokens)):  # end = start + length
        score = start[:, : tokens - length] + end[:, length:]
        score = np.where(allowed[:, : tokens - length] & allowed[:, length:], score, -np.inf)
        first = np.argmax(score, axis=1)
        value = score[np.arange(rows), first]
        better = value > best
        best = np.where(better, value, best)
        spans[better] = np.stack([first, first + length], axis=1)[better]
    bad = metrics.nonfinite_rows(start, allowed) | metrics.nonfinite_rows(end, allowed)  # scores no span reads: none
    spans[bad] = NO_SPAN
    return spans


def exact_matches(spans: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """Per row: the span is the target's (two rows with no span match: both decode none)."""
    return (np.asarray(spans) == np.asarray(targets)).all(axis=1)


def token_f1(spans: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """Per row: the F1 of the span's tokens against the target's (SQuAD's overlap F1, over token positions): 0 when
    they share none or only one of them is a span, 1 when neither is."""
    spans, targets = np.asarray(spans), np.asarray(targets)
    overlap = np.maximum(0, np.minimum(spans[:, 1], targets[:, 1]) - np.maximum(spans[:, 0], targets[:, 0]) + 1)
    none, target_none = spans[:, 0] == NO_SPAN, targets[:, 0] == NO_SPAN
    overlap = np.where(none | target_none, 0, overlap)
    length, target_length = spans[:, 1] - spans[:, 0] + 1, targets[:, 1] - targets[:, 0] + 1
    f1 = np.divide(2.0 * overlap, length + target_length, out=np.zeros(len(spans)), where=overlap > 0)
    return np.where(none & target_none, 1.0, f1)


@dataclass(frozen=True)
class SpanRows:
    """Per-row span decisions of the variant, FP32 and the labels, ready to summarise per slice."""

    outputs: np.ndarray  # start and end scores, (rows, 2, tokens)
    reference: np.ndarray
    exact: np.ndarray
    f1: np.ndarray
    agrees: np.ndarray
    agreement_f1: np.ndarray
    # rows with a context token, where an answer can be decided (None: every row). A row without one has no span in
    # any result, and "both decode none" would be a match whatever the scores: a variant returning noise scored 1.0
    # on single texts fed without their pair, so such rows are no part of any span figure
    answerable: np.ndarray | None = None
    # (rows, tokens): where an answer may lie (context_tokens), the only scores a span is decided by; max_abs_error
    # compares those alone (a model may mask the others with -inf, as FP32 and every variant then share)
    allowed: np.ndarray | None = None

    def summarise(self, name: str, mask: np.ndarray) -> SliceMetrics:
        size = int(np.count_nonzero(mask))
        scored = mask if self.answerable is None else mask & self.answerable
        count = int(np.count_nonzero(scored))
        exact, agreement = mean_or_nan(self.exact[scored]), mean_or_nan(self.agrees[scored])
        values = {"exact_match": exact, "f1": mean_or_nan(self.f1[scored]), "span_agreement": agreement,
                  "span_f1": mean_or_nan(self.agreement_f1[scored]),
                  "max_abs_error": self._max_abs_error(mask)}  # fmt: skip
        intervals = {"exact_match": wilson(exact, count), "f1": metrics.mean_interval(self.f1[scored]),
                     "span_agreement": wilson(agreement, count),
                     "span_f1": metrics.mean_interval(self.agreement_f1[scored])}  # fmt: skip
        counted = {} if self.answerable is None else dict.fromkeys(SPAN_FIGURES, count)
        return SliceMetrics(name=name, size=size, metrics=values, intervals=intervals, denominators=counted)

    def _max_abs_error(self, mask: np.ndarray) -> float:
        """The largest difference among the start and end scores of the scope's allowed tokens (every token without
        `allowed`); NaN where the scope holds none."""
        if self.allowed is None:
            return metrics.max_abs_error(self.outputs[mask], self.reference[mask])
        allowed = self.allowed[mask]
        if not allowed.any():
            return float("nan")
        own, reference = (np.swapaxes(o[mask], 1, 2)[allowed] for o in (self.outputs, self.reference))
        return metrics.max_abs_error(own, reference)


class Span(Task):
    name = "span"
    together = ("start scores", "end scores")
    metric_infos = (
        share_of_rows("exact_match", True,
                      "fraction of rows whose answer span is the labelled one (without labels: FP32's)",
                      decisions="span_agreement", row_mean=True),
        MetricInfo("f1", True,
                   "mean token-overlap F1 of the answer span with the labelled one (without labels: FP32's)",
                   low=0.0, high=1.0),
        share_of_rows("span_agreement", True, "fraction of rows whose answer span is FP32's", row_mean=True),
        MetricInfo("span_f1", True, "mean token-overlap F1 of the answer span with FP32's", low=0.0, high=1.0),
        MAX_ABS_ERROR,
    )  # fmt: skip
    default_gate_metric = "f1"

    def __init__(self, max_answer_tokens: int = MAX_ANSWER_TOKENS) -> None:
        self.max_answer_tokens = max_answer_tokens

    def configured(self, options: Mapping[str, Any]) -> Span:
        longest = self.whole_number_option(options, "max_answer_tokens", MAX_ANSWER_TOKENS, minimum=1, unit="tokens")
        assert longest is not None  # no null: every span has a longest answer
        return Span(longest)

    def labels_from_values(self, values: Sequence[Any], positions: np.ndarray) -> np.ndarray:
        cells = [list(v) if isinstance(v, (list, tuple, np.ndarray)) else None for v in values]
        bad = np.array([c is None or len(c) != 2 or any(no_label(x) or not float(x).is_integer() for x in c)
                        for c in cells])  # fmt: skip
        if bad.any():
            raise LabelError(f"{example_rows(bad, list(values), positions)}: expected [start, end] per row, the "
                             "answer's first and last token in the fed pair's tokens")  # fmt: skip
        labels = np.array(cells, dtype=np.float64).astype(np.int64).reshape(len(cells), 2)
        wrong = (labels[:, 0] < 0) | (labels[:, 1] < labels[:, 0])
        if wrong.any():
            raise LabelError(f"{example_rows(wrong, labels.tolist(), positions)}: expected 0 <= start <= end")
        return labels

    def check_labels(self, labels: np.ndarray, output: TensorMeta, positions: np.ndarray) -> None:
        tokens = output.shape[1] if len(output.shape) == 2 else None
        if tokens is not None and (labels[:, 1] >= tokens).any():
            raise LabelError(f"{example_rows(labels[:, 1] >= tokens, labels.tolist(), positions)}: the answer ends "
                             f"past output {output.name!r}'s {tokens} tokens")  # fmt: skip

    def output_problem(self, output: TensorMeta) -> str | None:
        if output.passthrough_of is not None:
            return f"output {output.name!r} is a copy of the input {output.passthrough_of!r}, not a prediction"
        if output.kind != "tensor":
            return container_problem(self.name, output)
        if not is_float(output) or len(output.shape) != 2:
            return (f"output {output.name!r} ({output.describe()}) is no float (rows, tokens) score: task 'span' "
                    "reads a start and an end score per token")  # fmt: skip
        return None

    def pick_outputs(self, outputs: Sequence[TensorMeta]) -> list[str] | None:
        """The one output named with 'start' and the one named with 'end' (start_logits, end_logits)."""
        starts = [o.name for o in outputs if "start" in o.name.lower()]
        ends = [o.name for o in outputs if "end" in o.name.lower()]
        return [starts[0], ends[0]] if len(starts) == len(ends) == 1 and starts != ends else None

    def values_read(self, outputs: np.ndarray, labels: np.ndarray | None,
                    feeds: Mapping[str, np.ndarray]) -> np.ndarray | None:  # fmt: skip
        """The tokens an answer may lie in (context_tokens): no span is decided by a score elsewhere, so a NaN/inf
        there (a model masking the question and padding with -inf) is no failure of FP32's nor the variant's."""
        outputs = np.asarray(outputs)
        return context_tokens(feeds, outputs.shape) if outputs.ndim == 2 else None

    def rows(self, outputs: np.ndarray, reference: np.ndarray, labels: np.ndarray | None, *,
             probabilities: bool | None = None) -> SpanRows:  # fmt: skip
        raise QbenchError("task 'span' judges its start and end scores together")

    def rows_together(
        self, outputs: Sequence[np.ndarray], reference: Sequence[np.ndarray], labels: np.ndarray | None,
        feeds: Mapping[str, np.ndarray],
    ) -> SpanRows:
        start, end = (np.asarray(o) for o in outputs)
        if start.ndim != 2 or start.shape != end.shape:
            raise QbenchError(f"task 'span' reads start and end scores of one shape (rows, tokens), got "
                              f"{list(start.shape)} and {list(end.shape)}")  # fmt: skip
        allowed = context_tokens(feeds, start.shape)
        if labels is not None:
            outside = ~(allowed[np.arange(len(labels)), labels[:, 0]] & allowed[np.arange(len(labels)), labels[:, 1]])
            if outside.any():
                raise LabelError(f"data.label: {example_rows(outside, labels.tolist())} (evaluation row): the answer "
                                 "lies outside the context's tokens (the pair's second text)")  # fmt: skip
        answerable = allowed.any(axis=1)
        if not answerable.any():
            raise QbenchError("no row holds a context token (the pair's second text, attended): task 'span' decodes "
                              "an answer inside the pair's second text; expected (question, context) pairs "
                              "(tokenizer.pair)")  # fmt: skip
        fp32 = best_spans(*reference, allowed, self.max_answer_tokens)
        failed = (fp32[:, 0] == NO_SPAN) & answerable  # FP32's NaN/inf row: its span cannot be read
        spans = best_spans(start, end, allowed, self.max_answer_tokens)
        spans[failed] = NO_SPAN  # never credited with a row FP32 could not score
        target = fp32 if labels is None else labels
        exact, agrees = exact_matches(spans, target) & ~failed, exact_matches(spans, fp32) & ~failed
        f1, agreement_f1 = (np.where(failed, 0.0, token_f1(spans, t)) for t in (target, fp32))
        return SpanRows(np.stack([start, end], axis=1), np.stack(list(reference), axis=1), exact, f1, agrees,
                        agreement_f1, None if answerable.all() else answerable, allowed)


SPAN = Span()
