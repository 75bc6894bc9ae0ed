"""Fixed, seeded inputs for the variants: calibration data for static INT8 and the set every variant is checked on.

The inputs come from what the export already knows how to make: the zoo model's own generator
(`ZooModel.random_inputs`) under a fixed seed, or, for a text model that ships a tokenizer (minilm), real
English sentences through that tokenizer, so the check sees the token ids a served model sees.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from latlab.export.zoo_model import ZooModel

Batches = list[dict[str, np.ndarray]]

CHECK_SEED, CALIBRATION_SEED = 20240, 7
# 96 samples in batches of 8: a top-1 agreement moves in steps of ~1%, and a 224x224 cnn is checked in seconds
CHECK_SAMPLES, CALIBRATION_SAMPLES, BATCH = 96, 32, 8
TOKENIZER_FILE = "tokenizer/tokenizer.json"
TEXT_INPUTS = ("input_ids", "attention_mask")

SENTENCES = (
    "A man is playing a guitar on the street corner.",
    "The cat slept on the warm windowsill all afternoon.",
    "How do I reset my password?",
    "Stock markets fell sharply after the central bank raised interest rates.",
    "She finished the marathon in under four hours.",
    "The recipe calls for two cups of flour and a pinch of salt.",
    "Our flight to Lisbon was delayed by three hours because of fog.",
    "Photosynthesis converts light energy into chemical energy.",
    "Please send the quarterly report before Friday.",
    "The children built a sandcastle near the waves.",
    "GPUs excel at large batches of parallel work.",
    "A small model at batch size one often runs faster on a CPU.",
    "He forgot his umbrella and got soaked on the way home.",
    "The museum reopens next spring after a long renovation.",
    "What is the capital of Australia?",
    "Canberra is the capital of Australia, not Sydney.",
    "The orchestra played Beethoven's ninth symphony to a full hall.",
    "Regular exercise lowers the risk of heart disease.",
    "My laptop battery drains quickly when the screen is bright.",
    "The court ruled that the contract was not valid.",
    "A dog chased a red ball across the park.",
    "Two kids are playing football in the rain.",
    "The new library has a quiet reading room on the top floor.",
    "Volcanic ash closed the airport for two days.",
    "Can you recommend a good book about the history of mathematics?",
    "The soup was too salty, so we added more water.",
    "Researchers found a new species of frog in the rainforest.",
    "Latency matters more than throughput for interactive users.",
    "The train leaves at seven and arrives just before noon.",
    "I would like to cancel my subscription, please.",
    "The company reported record profits this quarter.",
    "Heavy snow is expected in the mountains tonight.",
    "A woman is slicing tomatoes in a busy kitchen.",
    "The bridge was built in the nineteenth century and still carries traffic.",
    "Why is the sky blue during the day and red at sunset?",
    "Light scatters off air molecules, and blue light scatters the most.",
    "The team celebrated their first championship in twenty years.",
    "Water boils at a lower temperature at high altitude.",
    "He plays the piano every evening after dinner.",
    "The server returned an error because the request body was too large.",
    "Prices of fresh vegetables rose after the drought.",
    "The old lighthouse guided ships along the rocky coast for a century.",
    "Where can I buy tickets for tonight's concert?",
    "She is learning to speak Japanese before her trip to Kyoto.",
    "The committee postponed the vote until next week.",
    "Birds migrate south when the days grow shorter.",
    "Quantum computers use qubits that can hold superpositions of states.",
    "A toddler laughed as bubbles floated around the garden.",
    "The hospital opened a new wing for children with cancer.",
    "This phone charger does not work with my tablet.",
    "The novel tells the story of a family across three generations.",
    "Traffic was light on the highway this morning.",
    "The chef seasoned the fish with lemon, garlic and thyme.",
    "Astronomers observed a supernova in a distant galaxy.",
    "I cannot find the settings menu in the new version of the app.",
    "The farmers harvested the wheat before the storm arrived.",
    "A group of friends is hiking up a steep mountain trail.",
    "The bank will be closed on Monday for the public holiday.",
    "Electric cars are becoming cheaper to buy and to run.",
    "The professor explained the proof step by step.",
    "Nobody expected the underdog to win the final.",
    "The river flooded the village after a week of heavy rain.",
    "Is it safe to drink tap water in this city?",
    "The painting was sold at auction for a record price.",
)


def check_batches(zoo: ZooModel) -> Batches:
    """The set every variant is compared with FP32 on: the same inputs at every export of this model."""
    if takes_text(zoo):
        return _sentence_batches(zoo)
    return _seeded_batches(zoo, CHECK_SEED, CHECK_SAMPLES)


def calibration_batches(zoo: ZooModel) -> Batches:
    """Inputs for static quantization's activation ranges, drawn apart from the check set."""
    if takes_text(zoo):
        return _sentence_batches(zoo)
    return _seeded_batches(zoo, CALIBRATION_SEED, CALIBRATION_SAMPLES)


def describe(zoo: ZooModel, batches: Batches) -> str:
    """Where a set came from, in words, for the metadata."""
    rows = sum(len(next(iter(b.values()))) for b in batches)
    if takes_text(zoo):
        return f"{rows} fixed English sentences (export/samples.py) through the model's tokenizer, batches of {BATCH}"
    return f"{rows} samples of the model's input generator, seeded, batches of {BATCH}"


def _seeded_batches(zoo: ZooModel, seed: int, samples: int) -> Batches:
    with torch.random.fork_rng():  # a fixed set without disturbing the caller's random stream
        torch.manual_seed(seed)
        return [{n: t.numpy() for n, t in zoo.random_inputs(BATCH).items()} for _ in range(samples // BATCH)]


def takes_text(zoo: ZooModel) -> bool:
    """Whether the model takes token ids and ships a tokenizer (its sets are then real sentences)."""
    return TOKENIZER_FILE in zoo.files and set(zoo.inputs) == set(TEXT_INPUTS)


def _sentence_batches(zoo: ZooModel) -> Batches:
    return [tokenized(zoo, SENTENCES[start : start + BATCH]) for start in range(0, len(SENTENCES), BATCH)]


def tokenized(zoo: ZooModel, sentences: tuple[str, ...]) -> dict[str, np.ndarray]:
    """Sentences as the server tokenizes them: [CLS] ... [SEP], padded at the end to the longest, mask 1 for tokens."""
    from tokenizers import Tokenizer

    settings = zoo.extras.get("tokenizer", {})
    tokenizer = Tokenizer.from_file(str(Path(zoo.files[TOKENIZER_FILE])))
    tokenizer.no_padding()
    tokenizer.enable_truncation(settings.get("max_seq_length", 512))
    encodings = tokenizer.encode_batch(list(sentences))
    shape = (len(encodings), max(len(e.ids) for e in encodings))
    ids, mask = np.full(shape, settings.get("pad_id", 0), np.int64), np.zeros(shape, np.int64)
    for row, encoding in enumerate(encodings):
        ids[row, : len(encoding.ids)], mask[row, : len(encoding.ids)] = encoding.ids, 1
    return {"input_ids": ids, "attention_mask": mask}
