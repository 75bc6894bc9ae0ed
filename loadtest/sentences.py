"""Real-looking sentences of a chosen length in tokens, for loading text deployments (no tokenizer needed).

Every word below is one token of BERT's uncased WordPiece vocabulary (all-MiniLM-L6-v2's; a test checks
it with the model's own tokenizer.json), so a sentence of n words plus a final period is n + 1 tokens,
and the tokenizer adds [CLS] and [SEP]: `sentence(rng, tokens)` is exactly `tokens` tokens long.
"""

from __future__ import annotations

import random

WORDS = (
    "the", "a", "model", "server", "request", "answer", "batch", "queue", "time", "data", "user", "network",
    "system", "question", "people", "world", "city", "water", "house", "school", "night", "morning", "music",
    "film", "book", "story", "game", "team", "player", "season", "company", "market", "price", "money",
    "power", "energy", "light", "sound", "voice", "road", "river", "mountain", "island", "country", "state",
    "government", "law", "church", "family", "friend", "child", "woman", "man", "girl", "boy", "doctor",
    "teacher", "student", "car", "train", "ship", "plane", "window", "door", "table", "paper", "letter",
    "word", "number", "line", "point", "group", "part", "place", "way", "day", "week", "year", "hour",
    "minute", "and", "or", "but", "with", "without", "from", "into", "over", "under", "after", "before",
    "about", "between", "during", "is", "was", "are", "were", "has", "had", "will", "can", "could", "would",
    "should", "must", "runs", "sends", "takes", "makes", "gives", "finds", "keeps", "holds", "turns",
    "shows", "reads", "writes", "opens", "moves", "plays", "starts", "stops", "waits", "new", "old",
    "small", "large", "long", "short", "fast", "slow", "high", "low", "good", "bad", "early", "late",
    "first", "last", "next", "other", "same", "many", "few", "every", "each", "some", "most", "very",
    "still", "again", "often", "never", "always", "here", "there", "today", "red", "blue", "green", "white",
)
MIN_TOKENS = 3
"""[CLS], one word, [SEP]: the shortest sentence with a word (a period needs one token more)."""


def sentence(rng: random.Random, tokens: int) -> str:
    """A sentence of exactly `tokens` tokens with [CLS] and [SEP] (at least MIN_TOKENS)."""
    if tokens < MIN_TOKENS:
        raise ValueError(f"a sentence needs at least {MIN_TOKENS} tokens ([CLS], a word, [SEP]), got {tokens}")
    if tokens == MIN_TOKENS:
        return rng.choice(WORDS).capitalize()
    words = [rng.choice(WORDS) for _ in range(tokens - 3)]  # [CLS], [SEP] and the period take three
    return " ".join(words).capitalize() + "."


def token_length(rng: random.Random, tokens: int, tokens_max: int = 0) -> int:
    """The length of the next sentence: `tokens`, or uniform in tokens..tokens_max when tokens_max is set."""
    if tokens_max and tokens_max > tokens:
        return rng.randint(tokens, tokens_max)
    return tokens
