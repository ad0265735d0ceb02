"""The offline demo: a small CNN on scikit-learn's digits, exported to ONNX, and a data table with slices.

`make_digits_demo(out_dir)` writes what `recipes/digits.yaml` and `recipes/digits-torch.yaml` name:

- `models/digits.onnx`: input `input` (batch, 1, 8, 8) float32 in 0..1, output `logits` (batch, 10);
- `models/digits.pt`: the same model's state_dict, for `digits_cnn` (the PyTorch-source recipe);
- `data/digits.parquet`: one row per source image, columns `pixels` (64 float32), `label`,
  `split` (train / calib / eval, disjoint by `source_index`), `condition` (clean / noisy),
  `contrast` (normal / low) and `ink` (mean pixel intensity of the row as stored).

The model sees only the clean, normal-contrast `train` rows. A fixed fraction of
the calib and eval rows carries Gaussian pixel noise and a fixed fraction of the
eval rows is scaled down to low contrast, so the slices are sub-populations the
training data never showed: where a coarse quantisation grid is most likely to hurt.
Everything is drawn from one seed, so a seed gives the same files on every run.

Run it with ``python -m qbench.demo.digits --out .`` (needs the `demo` extra).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from qbench.errors import MissingExtraError, QbenchError
from qbench.sources.torch_model import single_torch_thread

if TYPE_CHECKING:  # pragma: no cover
    import torch

MODEL_FILE = Path("models/digits.onnx")
WEIGHTS_FILE = Path("models/digits.pt")
DATA_FILE = Path("data/digits.parquet")
RECIPE_FILE = Path("recipes/digits.yaml")
TORCH_RECIPE_FILE = Path("recipes/digits-torch.yaml")
# The recipes ship in the source tree, next to the package, not inside it.
_SOURCE_TREE = Path(__file__).resolve().parents[2]

TRAIN_IMAGES = 900
CALIB_IMAGES = 300  # the remaining 597 images are the eval split
NOISY_FRACTION = 0.3  # of the calib rows and of the eval rows
NOISE_STD = 0.2  # Gaussian pixel noise, on the 0..1 pixel scale, clipped back to 0..1
LOW_CONTRAST_FRACTION = 0.25  # of the eval rows
LOW_CONTRAST_SCALE = (0.3, 0.7)  # each low-contrast row is multiplied by a factor drawn from this range
DIGITS_MAX_VALUE = 16.0  # scikit-learn's digits hold integers 0..16

EPOCHS = 40
BATCH_SIZE = 32
LEARNING_RATE = 3e-3
ONNX_TOLERANCE = 1e-4  # largest |torch - onnxruntime| logit difference accepted after export
OPSET = 17


def make_digits_demo(out_dir: Path, seed: int = 0) -> dict[str, Path]:
    """Train, export and check the digits CNN; write the model and the data table under `out_dir`.

    Returns the written paths: "model", "weights" (the state_dict), "data", and "recipe" /
    "torch_recipe" when the source tree's `recipes/digits.yaml` / `recipes/digits-torch.yaml`
    were copied to `out_dir/recipes/` (not over an existing file, and not at all when qbench
    is installed without its source tree).
    """
    _import_torch()  # before any work: a missing extra should fail fast
    out_dir = Path(out_dir)
    table = build_digits_table(*load_digits_images(), seed=seed)
    train = table[table["split"] == "train"]
    evaluation = table[table["split"] == "eval"]
    with single_torch_thread():
        model = train_digits_cnn(_stack_pixels(train), train["label"].to_numpy(), seed=seed)
        model_path = export_digits_onnx(model, out_dir / MODEL_FILE)
        check_onnx_matches_torch(model, model_path, _stack_pixels(evaluation))
        weights_path = save_digits_weights(model, out_dir / WEIGHTS_FILE)
    data_path = write_digits_table(table, out_dir / DATA_FILE)
    paths = {"model": model_path, "weights": weights_path, "data": data_path}
    for kind, recipe_file in (("recipe", RECIPE_FILE), ("torch_recipe", TORCH_RECIPE_FILE)):
        recipe_path = _copy_source_recipe(recipe_file, out_dir)
        if recipe_path is not None:
            paths[kind] = recipe_path
    return paths


# -- data ---------------------------------------------------------------------------------------


def load_digits_images() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's 1,797 digits as (N, 64) float32 pixels in 0..1 and (N,) int64 labels."""
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise MissingExtraError("scikit-learn", "demo") from None
    digits = load_digits()
    pixels = (digits.data / DIGITS_MAX_VALUE).astype(np.float32)
    return pixels, digits.target.astype(np.int64)


def build_digits_table(pixels: np.ndarray, labels: np.ndarray, seed: int) -> pd.DataFrame:
    """One row per source image: split, then low contrast (eval), then noise (calib and eval).

    A row that is both low-contrast and noisy was scaled first and then got noise,
    as a faint image through a noisy sensor would.
    """
    rng = np.random.default_rng(seed)
    split = _assign_splits(len(pixels), rng)
    pixels = pixels.copy()
    contrast = np.full(len(pixels), "normal", dtype=object)
    condition = np.full(len(pixels), "clean", dtype=object)

    faint = _pick_fraction(np.flatnonzero(split == "eval"), LOW_CONTRAST_FRACTION, rng)
    pixels[faint] *= rng.uniform(*LOW_CONTRAST_SCALE, size=(len(faint), 1)).astype(np.float32)
    contrast[faint] = "low"

    for name in ("calib", "eval"):
        noisy = _pick_fraction(np.flatnonzero(split == name), NOISY_FRACTION, rng)
        noise = rng.normal(0.0, NOISE_STD, size=(len(noisy), pixels.shape[1])).astype(np.float32)
        pixels[noisy] = np.clip(pixels[noisy] + noise, 0.0, 1.0)
        condition[noisy] = "noisy"

    return pd.DataFrame(
        {
            "source_index": np.arange(len(pixels), dtype=np.int64),
            "pixels": list(pixels),
            "label": labels,
            "split": split,
            "condition": condition,
            "contrast": contrast,
            "ink": pixels.mean(axis=1).astype(np.float64),
        }
    )


def _assign_splits(count: int, rng: np.random.Generator) -> np.ndarray:
    """A random train / calib / eval label per source image (the sizes are fixed, the members drawn)."""
    if count <= TRAIN_IMAGES + CALIB_IMAGES:
        raise QbenchError(f"the digits set has {count} images; the demo needs more than {TRAIN_IMAGES + CALIB_IMAGES}")
    split = np.full(count, "eval", dtype=object)
    order = rng.permutation(count)
    split[order[:TRAIN_IMAGES]] = "train"
    split[order[TRAIN_IMAGES : TRAIN_IMAGES + CALIB_IMAGES]] = "calib"
    return split


def _pick_fraction(candidates: np.ndarray, fraction: float, rng: np.random.Generator) -> np.ndarray:
    """round(fraction * len(candidates)) of `candidates`, drawn without replacement, in ascending order."""
    return np.sort(rng.choice(candidates, size=round(fraction * len(candidates)), replace=False))


def _stack_pixels(rows: pd.DataFrame) -> np.ndarray:
    """The `pixels` cells of `rows` as the model's (N, 1, 8, 8) float32 input."""
    return np.stack(rows["pixels"].to_list()).astype(np.float32).reshape(-1, 1, 8, 8)


def write_digits_table(table: pd.DataFrame, path: Path) -> Path:
    """Write `table` as parquet with `pixels` stored as list<float32> (not float64)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.schema(
        [
            ("source_index", pa.int64()),
            ("pixels", pa.list_(pa.float32())),
            ("label", pa.int64()),
            ("split", pa.string()),
            ("condition", pa.string()),
            ("contrast", pa.string()),
            ("ink", pa.float64()),
        ]
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pandas(table, schema=schema, preserve_index=False), path)
    return path


# -- model --------------------------------------------------------------------------------------


def _import_torch() -> Any:
    try:
        import torch
    except ImportError:
        raise MissingExtraError("torch", "demo", "install torch first: pip install torch==2.13.0") from None
    return torch


def digits_cnn() -> torch.nn.Module:
    """Three 3x3 convolutions + ReLU (8x8 -> 8x8 -> 4x4 -> 2x2) and a linear head over the 2x2x64 features."""
    nn = _import_torch().nn
    return nn.Sequential(
        nn.Conv2d(1, 16, kernel_size=3, padding=1),
        nn.ReLU(),
        nn.Conv2d(16, 32, kernel_size=3, stride=2, padding=1),
        nn.ReLU(),
        nn.Conv2d(32, 64, kernel_size=3, stride=2, padding=1),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(64 * 2 * 2, 10),
    )


def train_digits_cnn(images: np.ndarray, labels: np.ndarray, seed: int) -> torch.nn.Module:
    """Train `digits_cnn` with Adam on (N, 1, 8, 8) images; same seed, same weights (on one thread)."""
    torch = _import_torch()
    torch.manual_seed(seed)
    model = digits_cnn()
    inputs, targets = torch.tensor(images), torch.tensor(labels)
    optimizer = torch.optim.Adam(model.parameters(), lr=LEARNING_RATE)
    shuffle = torch.Generator().manual_seed(seed)
    model.train()
    for _ in range(EPOCHS):
        for batch in torch.randperm(len(inputs), generator=shuffle).split(BATCH_SIZE):
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(inputs[batch]), targets[batch])
            loss.backward()
            optimizer.step()
    return model.eval()


def export_digits_onnx(model: torch.nn.Module, path: Path) -> Path:
    """Export with the TorchScript exporter (dynamo=False): one self-contained file, batch dimension dynamic.

    The dynamo exporter writes the weights to a side file by default and specialises
    a batch of 1, which ONNX Runtime's quantisation tools then trip over.
    """
    torch = _import_torch()
    path.parent.mkdir(parents=True, exist_ok=True)
    example = torch.zeros(2, 1, 8, 8)
    with warnings.catch_warnings():
        # The legacy exporter is chosen on purpose; its deprecation notice would only confuse demo users.
        warnings.filterwarnings("ignore", message=".*legacy TorchScript-based ONNX export", category=DeprecationWarning)
        torch.onnx.export(
            model,
            (example,),
            str(path),
            dynamo=False,
            input_names=["input"],
            output_names=["logits"],
            dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}},
            opset_version=OPSET,
        )
    return path


def save_digits_weights(model: torch.nn.Module, path: Path) -> Path:
    """Save a plain state_dict (tensors only), which qbench loads with torch.load(weights_only=True)."""
    torch = _import_torch()
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), path)
    return path


def check_onnx_matches_torch(model: torch.nn.Module, path: Path, images: np.ndarray) -> float:
    """Run `images` through torch and onnxruntime; return the largest logit difference.

    A difference above ONNX_TOLERANCE means the export is wrong: that is a qbench
    bug, not a user error, so it raises RuntimeError.
    """
    import onnxruntime as ort

    torch = _import_torch()
    with torch.no_grad():
        expected = model(torch.from_numpy(images)).numpy()
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (actual,) = session.run(["logits"], {"input": images})
    difference = float(np.max(np.abs(actual - expected)))
    if difference > ONNX_TOLERANCE:
        raise RuntimeError(f"{path}: onnxruntime logits differ from torch by {difference:.2e} (> {ONNX_TOLERANCE})")
    return difference


def _copy_source_recipe(recipe_file: Path, out_dir: Path) -> Path | None:
    """Copy `recipe_file` from the source tree to `out_dir` (never over an existing file)."""
    source, target = _SOURCE_TREE / recipe_file, out_dir / recipe_file
    if not source.is_file():
        return None
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, target)
    return target


# -- command line -------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m qbench.demo.digits",
        description="Train the digits CNN; write models/ (ONNX + state_dict) and data/digits.parquet under --out.",
    )
    parser.add_argument("--out", type=Path, default=Path("."), help="folder to write models/ and data/ into")
    parser.add_argument("--seed", type=int, default=0, help="seed for the splits, the noise and the training")
    args = parser.parse_args(argv)
    try:
        paths = make_digits_demo(args.out, seed=args.seed)
    except QbenchError as error:
        print(f"error: {error}", file=sys.stderr)
        return error.exit_code
    for kind, path in paths.items():
        print(f"{kind:>12}: {path}")
    if "recipe" in paths:
        print(f"next: qbench sweep {paths['recipe']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
