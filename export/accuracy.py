"""How close a variant (INT8, FP16) stays to its FP32 model: one figure per kind of model, and the bound it must meet.

Every figure runs from 0 to 1, higher is closer to FP32, so one `--min-accuracy` reads the same for
every model; what the figure is depends on what the model's output means:

- `cosine` (sentence embeddings, minilm): the smallest cosine similarity between a variant's embedding
  and FP32's over the check set (the mean is recorded beside it). Default bound 0.98: it keeps an
  embedding's error under a fifth of its length (|a - b| = sqrt(2 - 2 cos)); dynamic INT8 of
  all-MiniLM-L6-v2 keeps 0.988 with per-channel weights and falls to 0.950 with per-tensor ones.
- `top1` (classifiers, cnn): the share of the check set where the variant's top class is FP32's (the
  largest logit error is recorded beside it). Default 0.95: static INT8 commonly costs a classifier
  well under 1% top-1, and 0.95 leaves room for near-ties of an untrained network without passing a
  broken one (which agrees about 1 time in `classes`).
- `relative` (everything else: mlp, ffn, rnn, your own): 1 - the largest absolute error over the
  set divided by the largest FP32 output, as the export's parity check measures. Default 0.98 (a 2%
  error): INT8's 256 levels give under 1% on mlp and 0.1% on ffn; fp16 is held to 1% by its parity check.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnxruntime as ort

Outputs = list[list[np.ndarray]]  # per batch, every output of the model

LABELS = {
    "cosine": "min embedding cosine similarity to FP32",
    "top1": "top-1 agreement with FP32",
    "relative": "1 - max relative error vs FP32",
}
MEASURE_OF = {"minilm": "cosine", "cnn": "top1"}  # zoo models whose output is not compared element by element
DEFAULT_MIN = {"cosine": 0.98, "top1": 0.95, "relative": 0.98}


@dataclass(frozen=True)
class Bound:
    """The least accuracy a variant may keep and still be written as servable."""

    measure: str
    """Which figure: a key of LABELS."""
    minimum: float
    """The figure's lower bound, 0 to 1."""

    @classmethod
    def for_model(cls, kind: str | None, minimum: float | None = None) -> Bound:
        """The measure that fits a zoo model (`kind`; None for your own), with its default bound unless given."""
        measure = MEASURE_OF.get(kind or "", "relative")
        return cls(measure, DEFAULT_MIN[measure] if minimum is None else minimum)


@dataclass(frozen=True)
class Accuracy:
    """A variant's figure against FP32 on the check set, and the numbers behind it."""

    measure: str
    figure: float
    details: dict[str, float] = field(default_factory=dict)

    def meets(self, bound: Bound) -> bool:
        return self.figure >= bound.minimum  # NaN fails

    def record(self, bound: Bound, **context: object) -> dict:
        """What the metadata says about the check."""
        return {
            "status": "checked",
            "measure": self.measure,
            "label": LABELS[self.measure],
            "figure": self.figure,
            "min_accuracy": bound.minimum,
            **self.details,
            **context,
        }

    def shortfall(self, variant: str, bound: Bound) -> str:
        """One line: which variant, its figure and the bound it missed."""
        return f"{variant} refused: {LABELS[self.measure]} {self.figure:.4f} < {bound.minimum:g} (--min-accuracy)"


def run(path: Path, batches: list[dict[str, np.ndarray]], providers: list[str] | None = None) -> Outputs:
    """Every output of the model at `path` for each batch."""
    session = ort.InferenceSession(str(path), providers=providers or ["CPUExecutionProvider"])
    return [session.run(None, feed) for feed in batches]


def compare(measure: str, reference: Outputs, variant: Outputs) -> Accuracy:
    """The variant's figure of `measure` against the FP32 reference outputs (same batches, same order)."""
    broken = sum(int(np.size(out) - np.isfinite(out).sum()) for batch in variant for out in batch)
    if broken:  # an overflow or a broken cast: no figure can be trusted
        return Accuracy(measure, 0.0, {"non_finite_values": broken})
    return _MEASURES[measure](reference, variant)


def _rows(outputs: Outputs) -> np.ndarray:
    """The first output of every batch, one row per sample, in float64."""
    return np.concatenate([batch[0].reshape(len(batch[0]), -1) for batch in outputs]).astype(np.float64)


def _cosine(reference: Outputs, variant: Outputs) -> Accuracy:
    want, have = _rows(reference), _rows(variant)
    norms = np.linalg.norm(want, axis=1) * np.linalg.norm(have, axis=1)
    cosine = np.where(norms > 0, np.sum(want * have, axis=1) / np.where(norms > 0, norms, 1.0), 0.0)
    return Accuracy(
        "cosine",
        float(cosine.min()),
        {"min_cosine": float(cosine.min()), "mean_cosine": float(cosine.mean()), "samples": len(cosine)},
    )


def _top1(reference: Outputs, variant: Outputs) -> Accuracy:
    want, have = _rows(reference), _rows(variant)
    agreement = float(np.mean(want.argmax(axis=1) == have.argmax(axis=1)))
    error, scale = float(np.max(np.abs(want - have))), float(np.max(np.abs(want)))
    return Accuracy(
        "top1",
        agreement,
        {
            "top1_agreement": agreement,
            "max_logit_error": error,
            "max_logit_error_rel": error / scale if scale > 0 else error,
            "samples": len(want),
        },
    )


def _relative(reference: Outputs, variant: Outputs) -> Accuracy:
    worst_abs = worst_rel = 0.0
    for index in range(len(reference[0])):  # each output on its own scale
        error = max(
            float(np.max(np.abs(w[index].astype(np.float64) - h[index]), initial=0.0))
            for w, h in zip(reference, variant)
        )
        scale = max(float(np.max(np.abs(w[index]), initial=0.0)) for w in reference)
        worst_abs, worst_rel = max(worst_abs, error), max(worst_rel, error / scale if scale > 0 else error)
    samples = sum(len(batch[0]) for batch in reference)
    return Accuracy(
        "relative",
        max(0.0, 1.0 - worst_rel),
        {"max_rel_error": worst_rel, "max_abs_error": worst_abs, "samples": samples},
    )


_MEASURES = {"cosine": _cosine, "top1": _top1, "relative": _relative}
