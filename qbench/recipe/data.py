"""The recipe's `data:` section: the data file, its inputs and label, calibration and evaluation rows, slices.

    data:
      path: reviews.parquet
      inputs: {text: {tokenizer: {path: tokenizer}}}
      label: label
      calibration: {samples: 256, stratify_by: label}
      evaluation: {limit: 2000}
      slices: [{by: language}, {by_length: text, buckets: [16, 64]}]

Also `path_field`, the recipe's path fields: a string in the YAML, relative to the recipe file.
"""

from __future__ import annotations

import codecs
import unicodedata
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, PrivateAttr, Tag, ValidationInfo, field_validator, model_validator

from qbench.recipe.filters import check_filter
from qbench.techniques.options import Filter, Seed
from qbench.techniques.options import StrictConfig as _Strict


def path_field(description: str, default: Any = None) -> Any:
    """A path field: a string in the YAML, relative to the recipe file."""
    return Field(default, description=description, strict=False)


class CalibrationSpec(_Strict):
    path: Path | None = path_field("draw calibration rows from this file instead of data.path")
    filter: Filter | None = None
    samples: int = Field(256, gt=0, description="rows drawn for calibration (fewer if fewer rows match)")
    seed: Seed = 0
    stratify_by: str | None = Field(None, description="column whose values are sampled in proportion")
    group_by: str | None = Field(None, description="column naming each row's group (a query, a series): calibration "
                                 "and selection rows are drawn as whole groups, never part of one")
    batch_size: int = Field(16, gt=0, description="rows per calibration batch")
    overlap: Literal["hold_out", "allow"] = Field(
        "hold_out", description="calibration rows drawn from data.path that are also evaluation rows: hold_out (they "
        "are not evaluated) or allow (they are, and the overlap is counted and warned about)",
    )

    _check = field_validator("filter")(lambda v: None if v is None else check_filter(v))


class EvaluationSpec(_Strict):
    filter: Filter | None = None
    limit: int | None = Field(None, gt=0, description="evaluate at most this many rows (first rows after filtering)")
    batch_size: int = Field(64, gt=0, description="rows per inference batch during evaluation")

    _check = field_validator("filter")(lambda v: None if v is None else check_filter(v))


# scopes the gate judges besides slices: a slice so named reads as one
RESERVED_SCOPE_NAMES = ("overall", "outputs", "slo")


def _check_slice_name(name: str | None) -> str | None:
    """A named slice's name is printed as written in every gate line, table and report, so it must print as itself:
    a newline in it would forge a line of the gate's one-line-per-check output (and a control character makes JUnit
    XML unreadable), an empty name or spaces at either end would read as another slice's. A `by` slice's values are
    escaped instead (`qbench.data.filters.format_value`); a name the user writes can simply be written plainly."""
    if name is None:
        return None
    if name in RESERVED_SCOPE_NAMES:
        raise ValueError(f"{name!r} is the gate's own scope; call the slice something else")
    hidden = sorted({repr(c)[1:-1] for c in name if not c.isprintable()})
    if not name or name != name.strip() or hidden or unicodedata.normalize("NFC", name) != name:
        why = (f"holds {', '.join(hidden)}" if hidden else "is empty" if not name else "has spaces at an end"
               if name != name.strip() else "has accents not composed as NFC")  # fmt: skip
        raise ValueError(f"got {name!r}, which {why}; expected a name that prints as itself (printable characters, "
                         "no spaces at either end, NFC): it is printed as written in the gate's lines and reports")
    return name


class SliceSpec(_Strict):
    """`by: column` (one slice per distinct value), `name` + `filter`, or `by_length: text column` + `buckets`."""

    by: str | None = None
    name: str | None = None
    filter: Filter | None = None
    by_length: str | None = Field(None, description="text column whose token count is bucketed")
    buckets: list[Annotated[int, Field(gt=0)]] | None = Field(None, description="upper bounds of token-length buckets")

    _check = field_validator("filter")(lambda v: None if v is None else check_filter(v))
    _check_name = field_validator("name")(_check_slice_name)

    @model_validator(mode="after")
    def _one_kind(self) -> SliceSpec:
        kinds = [self.by is not None, self.name is not None or self.filter is not None, self.by_length is not None]
        if sum(kinds) > 1:
            raise ValueError("a slice has one of `by`, `name` + `filter`, or `by_length` + `buckets`")
        if self.by_length is not None and not self.buckets:
            raise ValueError("buckets: `by_length` needs token-length bucket bounds, e.g. [16, 32, 64]")
        if self.buckets is not None and self.by_length is None:
            raise ValueError("buckets: applies only with `by_length`")
        if not any(kinds) or (kinds[1] and (self.name is None or self.filter is None)):
            raise ValueError("a slice needs `by: <column>`, or both `name` and `filter`, or `by_length` + `buckets`")
        return self


class TokenizerSpec(_Strict):
    """How a text column is tokenized; with `pair`, each row's two texts are encoded together as the tokenizer
    encodes a pair (`tokenizer(texts, text_pair=pairs)`: [CLS] text [SEP] pair [SEP], token_type_ids 0 then 1), as
    cross-encoders, NLI and QA models are trained: two texts joined into one column would feed token_type_ids of 0
    throughout, inputs the model never saw."""

    path: str = Field(description="a local tokenizer folder (relative to the recipe) or an installed model's folder")
    max_length: int = Field(128, gt=0)
    padding: Literal["max_length", "longest"] = "max_length"
    pair: str | None = Field(None, description="the column of each row's second text (a passage, a hypothesis)")
    truncation: Literal["longest_first", "only_first", "only_second"] = Field(
        "longest_first", description="which text of a pair loses tokens past max_length: longest_first cuts the "
        "longer one token at a time; only_first / only_second cut that text only"
    )

    @model_validator(mode="after")
    def _truncation_of_a_pair(self) -> TokenizerSpec:
        if self.truncation != "longest_first" and self.pair is None:
            raise ValueError(f"truncation: {self.truncation} applies to a pair of texts; set `pair: <column>` "
                             "or leave truncation out")  # fmt: skip
        return self


class TextInputSpec(_Strict):
    """A text column tokenized offline; the tokenizer's outputs feed the model inputs of the same names."""

    tokenizer: TokenizerSpec


class ImageSpec(_Strict):
    """How an image column's cells (file paths) are decoded into a model input (qbench.data.images). Left out,
    `size`, `mode` and `layout` are read from the model input's shape where it states them."""

    root: Path = path_field("the folder relative paths in the column are read from; relative to the recipe", ...)
    size: Annotated[list[Annotated[int, Field(gt=0)]], Field(min_length=2, max_length=2)] | None = Field(
        None, description="[height, width] fed to the model; default the model input's static height and width"
    )
    resize: Literal["center_crop", "stretch"] = Field(
        "center_crop", description="center_crop: scale to cover size / crop_pct keeping the aspect ratio, then crop "
        "the centre (torchvision Resize + CenterCrop); stretch: scale to size, aspect ratio not kept",
    )
    crop_pct: float = Field(1.0, gt=0, le=1, description="center_crop: the share of the scaled image kept (timm's "
                            "crop_pct; 0.875 is Resize(256) + CenterCrop(224))")  # fmt: skip
    interpolation: Literal["bilinear", "bicubic", "nearest"] = "bilinear"
    mode: Literal["RGB", "L"] | None = Field(None, description="RGB or L (grayscale); default from the model "
                                             "input's channels (3: RGB, 1: L)")  # fmt: skip
    layout: Literal["NCHW", "NHWC"] | None = Field(None, description="default from the model input's shape, else NCHW")
    scale: float = Field(1 / 255, gt=0, description="multiplies the 0..255 pixel values before mean and std")
    mean: list[float] | None = Field(None, min_length=1, max_length=3,
                                     description="per channel, subtracted after scale")  # fmt: skip
    std: list[Annotated[float, Field(gt=0)]] | None = Field(
        None, min_length=1, max_length=3, description="per channel, divides after mean"
    )

    # where a sweep reads each file: file name (qbench.data.images.image_file) -> its copy in the sweep's
    # snapshot and the sha256 of its bytes (qbench.execute.snapshot); None: the user's files, hashed as read
    _copies: dict[str, tuple[Path, str]] | None = PrivateAttr(default=None)

    @property
    def copies(self) -> dict[str, tuple[Path, str]] | None:
        return self._copies

    def read_from(self, copies: dict[str, tuple[Path, str]]) -> ImageSpec:
        """This spec, its files read from `copies` (a sweep's snapshot of them)."""
        spec = self.model_copy()
        spec._copies = copies
        return spec

    @model_validator(mode="after")
    def _crop_pct_with_center_crop(self) -> ImageSpec:
        if self.crop_pct != 1.0 and self.resize != "center_crop":
            raise ValueError("crop_pct: applies to resize: center_crop only; remove it")
        return self


class ImageInputSpec(_Strict):
    """A column of image file paths decoded with Pillow into one model input."""

    image: ImageSpec
    input: str | None = Field(None, description="the model input fed; default the one input no other column feeds")


InputTarget = str | TextInputSpec | ImageInputSpec
"""What a `data.inputs` column feeds: a model input's name, a tokenizer's outputs, or a decoded image."""


def _input_kind(value: Any) -> str:
    """Which kind of `data.inputs` entry `value` is, told by its key (`image:` or `tokenizer:`), so that a mistake
    in one is reported as that kind's, not as every kind's (tags are the types' names: error lines leave them out)."""
    if isinstance(value, dict):
        return ImageInputSpec.__name__ if "image" in value else TextInputSpec.__name__
    return type(value).__name__ if isinstance(value, (TextInputSpec, ImageInputSpec)) else "str"


_InputEntry = Annotated[
    Annotated[str, Tag("str")] | Annotated[TextInputSpec, Tag(TextInputSpec.__name__)]
    | Annotated[ImageInputSpec, Tag(ImageInputSpec.__name__)],
    Discriminator(_input_kind),
]


class CsvSpec(_Strict):
    """How the CSV/TSV files of `data` write their cells. The decimal mark is declared, never guessed: '1,234' is
    1234 in one locale and 1.234 in another."""

    delimiter: Literal[",", ";", "\t", "|"] | None = Field(
        None, description="between fields: ',' ';' '\\t' (tab) or '|'; default a tab for .tsv files, else ','"
    )
    decimal: Literal[".", ","] = Field(".", description="the decimal mark of the files' numbers")
    thousands: Literal[",", ".", " ", "'", "\u00a0", "\u202f"] | None = Field(
        None, description="the separator grouping the numbers' thousands ('1.234,5'), a space, or a no-break space "
        "U+00A0 / U+202F; default none"
    )

    @field_validator("thousands")
    @classmethod
    def _thousands_not_decimal(cls, v: str | None, info: ValidationInfo) -> str | None:
        decimal = info.data.get("decimal", ".")
        if v is not None and v == decimal:
            raise ValueError(f"got {v!r}, the decimal mark (data.csv.decimal{', by default' if v == '.' else ''}); "
                             "expected a separator other than the decimal mark, as a file grouping thousands with "
                             f"{v!r} declares: data.csv: {{decimal: {'.' if v == ',' else ','!r}, thousands: {v!r}}}")
        return v


class DataSpec(_Strict):
    path: Path = path_field(".parquet, .csv, .tsv, .jsonl, .npz, or a `datasets` save_to_disk folder; "
                            "relative to the recipe", ...)
    inputs: dict[str, _InputEntry] = Field(
        description="data column -> model input name, a text column -> {tokenizer: {...}}, or a column of image "
        "paths -> {image: {...}}"
    )
    label: str | list[str] | None = Field(
        None, description="label column (multilabel: or one 0/1 column per label, in the model's output column order); "
        "without it accuracy is agreement with FP32",
    )
    classes: list[str | int] | None = Field(
        None, description="classification: the label values naming the model's score columns, in column order"
    )
    calibration: CalibrationSpec = CalibrationSpec()
    evaluation: EvaluationSpec = EvaluationSpec()
    slices: list[SliceSpec] = []
    csv: CsvSpec = CsvSpec()
    encoding: str | None = Field(
        None, description="the text encoding of CSV/TSV and JSON lines files without a byte order mark (cp1252, "
        "latin-1, utf-16, ...); default UTF-8 (a byte order mark is read whatever this says)",
    )
    nonfinite_inputs: Literal["error", "drop", "keep"] = Field(
        "error", description="rows whose input columns hold NaN/inf: error (default), drop them, or keep them (a model "
        "that reads NaN as missing; counted in results, each such column a `missing:<column>` slice)",
    )

    @property
    def label_columns(self) -> tuple[str, ...]:
        """The columns `label` names: none, its one column, or (multilabel) one column per label."""
        if self.label is None:
            return ()
        return (self.label,) if isinstance(self.label, str) else tuple(self.label)

    @field_validator("label")
    @classmethod
    def _label_columns_distinct(cls, v: str | list[str] | None) -> str | list[str] | None:
        if isinstance(v, list):
            repeated = sorted({c for c in v if v.count(c) > 1})
            if not v or repeated:
                got = f"column {repeated[0]!r} twice" if repeated else "an empty list"
                raise ValueError(f"got {got}; expected one column name, or (task multilabel) the distinct 0/1 "
                                 "columns of the labels in the order of the model's output columns")  # fmt: skip
        return v

    @field_validator("encoding")
    @classmethod
    def _known_codec(cls, v: str | None) -> str | None:
        if v is not None:
            try:
                codec = codecs.lookup(v)
            except LookupError:
                codec = None
            # a bytes-to-bytes or text-to-text codec (rot13, base64, zlib) is no file's encoding: open() refuses it
            # only when the file is read, mid-sweep; the flag is the one open() itself goes by
            if codec is None or not getattr(codec, "_is_text_encoding", True):
                raise ValueError(f"got {v!r}, which names no text encoding Python knows; expected one such as utf-8, "
                                 "cp1252, latin-1 or utf-16")
        return v

    @field_validator("classes")
    @classmethod
    def _classes_distinct(cls, v: list[str | int] | None) -> list[str | int] | None:
        if v is not None and (not v or len({str(c) for c in v}) != len(v)):
            raise ValueError("expected the distinct class names in the order of the model's score columns")
        return v

    @model_validator(mode="after")
    def _file_options_for_their_files(self) -> DataSpec:
        """`csv:` describes CSV/TSV files, `encoding:` CSV/TSV/JSONL ones: set beside none (a Parquet path), either
        would be ignored silently."""
        paths = [self.path, *([self.calibration.path] if self.calibration.path is not None else [])]
        for option, kinds, fits in (("csv", ".csv/.tsv", _is_text_table),
                                    ("encoding", ".csv/.tsv/.jsonl/.ndjson", _is_text_file)):  # fmt: skip
            given = option in self.model_fields_set and getattr(self, option) is not None
            if given and not any(fits(p) for p in paths):
                calibration = f" and data.calibration.path {paths[1].name}" if len(paths) > 1 else ""
                raise ValueError(f"{option}: describes {kinds} files, but data.path is {self.path.name}{calibration}; "
                                 "remove it")
        return self

    @property
    def pair_columns(self) -> tuple[str, ...]:
        """The columns of the second texts of text inputs encoded as pairs (`tokenizer.pair`)."""
        return tuple(spec.tokenizer.pair for spec in self.inputs.values()
                     if isinstance(spec, TextInputSpec) and spec.tokenizer.pair is not None)  # fmt: skip

    @property
    def fed_columns(self) -> tuple[str, ...]:
        """Every column whose cells feed the model: the inputs' columns and the second texts of pairs."""
        return (*self.inputs, *self.pair_columns)

    @property
    def image_columns(self) -> dict[str, ImageSpec]:
        """Column -> how it is decoded, for the columns of image paths."""
        return {column: spec.image for column, spec in self.inputs.items() if isinstance(spec, ImageInputSpec)}

    @field_validator("inputs")
    @classmethod
    def _inputs_nonempty(cls, v: dict[str, InputTarget]) -> dict[str, InputTarget]:
        if not v:
            raise ValueError("expected at least one `column: input_name` pair")
        for column, spec in v.items():
            if isinstance(spec, TextInputSpec) and spec.tokenizer.pair == column:
                raise ValueError(f"{column}.tokenizer.pair: got {column!r}, the text column itself; expected the "
                                 "column of each row's second text")  # fmt: skip
        return v


def _is_text_file(path: Path) -> bool:
    """A CSV, TSV or JSON lines file, compressed or not."""
    return _is_text_table(path) or any(suffix.lower() in (".jsonl", ".ndjson") for suffix in path.suffixes[-2:])


def _is_text_table(path: Path) -> bool:
    """A CSV or TSV file, compressed or not (rows.csv.gz)."""
    suffixes = [suffix.lower() for suffix in path.suffixes[-2:]]
    return any(suffix in (".csv", ".tsv") for suffix in suffixes)
