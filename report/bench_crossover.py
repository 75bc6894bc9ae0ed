"""The bench's model-size crossover: per bench machine with batch-1 points of both ORT backends, from what model
size the GPU is faster than the CPU, in one sentence."""

from __future__ import annotations


def size_crossover(bench_docs: list[dict]) -> list[str]:
    """Per bench machine with both ort-cpu and ort-cuda batch-1 points: from what size the GPU wins."""
    sentences = []
    for doc in bench_docs:
        pairs = _batch1_pairs(doc)
        if not pairs:
            continue
        host = (doc.get("machine") or {}).get("name") or (doc.get("machine") or {}).get("gpu") or "?"
        wins = [params for params, cpu_s, gpu_s in pairs if gpu_s < cpu_s]
        sizes = f"{len(pairs)} sizes, {human(pairs[0][0])} to {human(pairs[-1][0])} parameters"
        if not wins:
            sentences.append(
                f"bench on {host}: at batch 1 the CPU was as fast or faster at every measured size ({sizes})."
            )
            continue
        threshold = None
        for params, cpu_s, gpu_s in reversed(pairs):  # the GPU must win at this size and every larger one
            if gpu_s >= cpu_s:
                break
            threshold = params
        if threshold is None:
            sentences.append(
                f"bench on {host}: at batch 1 the GPU won at {len(wins)} of {sizes}, but not at the "
                f"largest: no size crossover."
            )
        else:
            sentences.append(
                f"bench on {host}: from about {human(threshold)} parameters the GPU wins at batch 1 "
                f"({len(wins)} of {sizes})."
            )
    return sentences


def _batch1_pairs(doc: dict) -> list[tuple[float, float, float]]:
    """(params, CPU seconds, GPU seconds) for every batch-1 point measured on both ORT backends."""
    cells: dict[tuple, dict[str, float]] = {}
    for experiment in doc.get("experiments", []):
        for point in experiment.get("points", []):
            if point.get("batch_size") != 1 or not point.get("params") or point.get("median_s") is None:
                continue
            if point.get("backend") in ("ort-cpu", "ort-cuda"):
                varied = point.get(experiment.get("vary"))
                key = (experiment.get("name"), experiment.get("model"), point["params"], varied)
                cells.setdefault(key, {})[point["backend"]] = point["median_s"]
    pairs = [(key[2], c["ort-cpu"], c["ort-cuda"]) for key, c in cells.items() if len(c) == 2]
    return sorted(pairs)


def human(count: float) -> str:
    """2100000 -> '2.1M'."""
    for scale, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if count >= scale:
            return f"{count / scale:.3g}{suffix}"
    return f"{count:.3g}"
