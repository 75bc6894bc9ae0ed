"""The committed lab run of the first results format (tests/data/lab-v1), unpacked as the lab left it."""

from __future__ import annotations

import gzip
from pathlib import Path

from latlab.loadtest.results import RESULTS_FILE

LAB_V1 = Path(__file__).parent / "data" / "lab-v1"
MODELS = ("cnn", "ffn", "minilm", "mlp")


def unpack_lab_v1(folder: Path) -> Path:
    """One folder per model holding its results.json, and bench/bench.json; returns `folder`."""
    for model in MODELS:
        (folder / model).mkdir(parents=True)
        (folder / model / RESULTS_FILE).write_bytes(gzip.decompress((LAB_V1 / f"{model}-results.json.gz").read_bytes()))
    (folder / "bench").mkdir()
    (folder / "bench" / "bench.json").write_bytes(gzip.decompress((LAB_V1 / "bench.json.gz").read_bytes()))
    return folder
