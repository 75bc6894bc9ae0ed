"""Text in: a deployment's tokenizer turns a BYTES tensor of UTF-8 sentences into the model's token tensors.

Tokenization happens on the request thread, before the request is queued (docs/tokenizer.md has the
measurement behind that choice): a sentence that is not UTF-8, or empty, fails its own request alone, and
the batcher then pads the token tensors of the requests it groups (the deployment's [padding], filled in
here for the token inputs). The tokenizer is the model's own tokenizer.json, run by Hugging Face's
`tokenizers` (Rust); sentences longer than max_length are cut there, and the response says how many were.
"""

from __future__ import annotations

import time
from dataclasses import replace

import numpy as np
from tokenizers import Tokenizer

from latlab.common.settings import PaddingSettings
from latlab.server.config import DeploymentConfig, TokenizerSettings
from latlab.server.errors import BadRequest, ConfigError
from latlab.server.protocol import datatype_of, shown

TEXT_INPUT = "text"
"""The one input of a text deployment: BYTES, shape [-1], one sentence per batch row."""
TOKEN_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
"""The model inputs a tokenizer can fill: ids, 1 for real tokens, segment 0 (one sentence)."""


class TextFrontEnd:
    """Decodes and tokenizes a request's sentences into the model's token tensors (int64, [n, longest])."""

    def __init__(self, settings: TokenizerSettings, model_inputs: dict[str, np.dtype], deployment: str) -> None:
        unknown = sorted(set(model_inputs) - set(TOKEN_INPUTS))
        if unknown or "input_ids" not in model_inputs:
            raise ConfigError(
                f"deployment '{deployment}' [tokenizer]: a text deployment's model must take "
                f"input_ids (and optionally attention_mask, token_type_ids); it takes "
                f"{sorted(model_inputs)}"
            )
        try:
            self.tokenizer = Tokenizer.from_file(str(settings.file))
        except Exception as exc:  # tokenizers raises a bare Exception for a file it cannot parse
            raise ConfigError(
                f"deployment '{deployment}' [tokenizer]: {settings.file} is not a tokenizers "
                f"tokenizer.json ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})"
            ) from None
        self.pad_id = self._pad_id()
        self.tokenizer.no_padding()  # the batcher pads across requests; each request is padded below
        self.tokenizer.enable_truncation(settings.max_length)
        self.max_length = settings.max_length
        self.file = settings.file
        self.dtypes = dict(model_inputs)

    def _pad_id(self) -> int:
        padding = self.tokenizer.padding
        if padding is not None:
            return int(padding["pad_id"])
        pad = self.tokenizer.token_to_id("[PAD]")
        return 0 if pad is None else pad

    def padding(self, configured: PaddingSettings) -> PaddingSettings:
        """The batcher's padding: the token inputs padded on axis 1 (pad id, mask 0), keeping the config's
        bucket; pad values the config names itself win."""
        values = {"input_ids": self.pad_id, "attention_mask": 0, "token_type_ids": 0}
        values = {name: v for name, v in values.items() if name in self.dtypes}
        return replace(configured, axis=1, values={**values, **configured.values})

    def metadata(self, model_metadata: dict) -> dict:
        """The model's metadata as a client sees it: the text input instead of the token tensors."""
        return {
            **model_metadata,
            "inputs": [{"name": TEXT_INPUT, "datatype": "BYTES", "shape": [-1]}],
            "parameters": {
                "max_length": self.max_length,
                "tokenizer": self.file.name,
                "truncation": "sentences longer than max_length tokens are cut there; "
                "parameters.truncated of a response counts them",
            },
        }

    def encode(self, inputs: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], int]:
        """The request's token tensors and how many of its sentences were truncated; BadRequest naming the
        problem for anything but a non-empty BYTES vector of non-empty UTF-8 sentences."""
        sentences = self._sentences(inputs)
        encodings = self.tokenizer.encode_batch(sentences, add_special_tokens=True)
        longest = max(len(e.ids) for e in encodings)
        ids = np.full((len(encodings), longest), self.pad_id, dtype=np.int64)
        mask = np.zeros((len(encodings), longest), dtype=np.int64)
        for row, encoding in enumerate(encodings):
            ids[row, : len(encoding.ids)] = encoding.ids
            mask[row, : len(encoding.ids)] = 1
        tensors = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
        tensors = {
            name: array.astype(self.dtypes[name], copy=False) for name, array in tensors.items() if name in self.dtypes
        }
        return tensors, sum(1 for e in encodings if e.overflowing)

    def _sentences(self, inputs: dict[str, np.ndarray]) -> list[str]:
        if set(inputs) != {TEXT_INPUT}:
            raise BadRequest(
                f"this model takes one input '{TEXT_INPUT}' (BYTES, shape [-1]: UTF-8 sentences); "
                f"got {sorted(shown(n) for n in inputs)}"
            )
        array = inputs[TEXT_INPUT]
        if array.dtype != object:
            raise BadRequest(f"input '{TEXT_INPUT}' must be BYTES (UTF-8 sentences), got {datatype_of(array.dtype)}")
        if array.ndim != 1 or array.shape[0] < 1:
            raise BadRequest(
                f"input '{TEXT_INPUT}' must have shape [-1] with at least one sentence, got {list(array.shape)}"
            )
        sentences = []
        for index, item in enumerate(array):
            try:
                sentence = item.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise BadRequest(
                    f"input '{TEXT_INPUT}': sentence {index} is not UTF-8 ({exc.reason} at byte {exc.start})"
                ) from None
            if not sentence.strip():
                raise BadRequest(f"input '{TEXT_INPUT}': sentence {index} is empty (or only whitespace)")
            sentences.append(sentence)
        return sentences


def text_front_end(config: DeploymentConfig, model_inputs: dict[str, np.dtype]) -> TextFrontEnd | None:
    """The deployment's front end when it has a [tokenizer] table, else None (it takes token tensors)."""
    if config.tokenizer is None:
        return None
    return TextFrontEnd(config.tokenizer, model_inputs, config.name)


def timed_encode(front: TextFrontEnd, inputs: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], int, float]:
    """`front.encode` and the seconds it took (the preprocess histogram's sample)."""
    started = time.perf_counter()
    tensors, truncated = front.encode(inputs)
    return tensors, truncated, time.perf_counter() - started
