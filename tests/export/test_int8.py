"""latlab.export.int8: INT8 variants of real exported zoo models, checked against FP32 before they may be served."""

from __future__ import annotations

import math
from pathlib import Path

import onnx
import pytest
import torch
from torch import nn
from torch.nn import functional as F

from latlab import cli
from latlab.export import samples
from latlab.export.accuracy import Bound, compare, run
from latlab.export.int8 import export_int8, int8_folder
from latlab.export.minilm import model_dir, random_tokens
from latlab.export.onnx_export import AccuracyBelowBound, export, load_metadata
from latlab.export.zoo import ZooModel, build_cnn, build_ffn, build_mlp

VOCAB, WIDTH, EMBEDDING = 30522, 16, 32  # BERT's uncased vocabulary, so every id of the real tokenizer is valid
QDQ_OPS = {"QuantizeLinear", "DequantizeLinear"}


class TinyTextEncoder(nn.Module):
    """A sentence embedding in miniature: token embeddings through one Linear, masked mean, L2 normalisation."""

    def __init__(self) -> None:
        super().__init__()
        self.embed, self.proj = nn.Embedding(VOCAB, WIDTH), nn.Linear(WIDTH, EMBEDDING)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        mask = attention_mask.unsqueeze(-1).to(torch.float32)
        pooled = (self.proj(self.embed(input_ids)) * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
        return F.normalize(pooled, dim=1)


def tiny_text() -> ZooModel:
    """The tiny encoder with minilm's tokenizer beside it: checked on real sentences, by cosine similarity."""
    return ZooModel(
        TinyTextEncoder().eval(),
        random_tokens(2, 8, VOCAB),
        ["embedding"],
        {"tiny": True},
        dynamic_axes={"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"}},
        files={samples.TOKENIZER_FILE: model_dir() / "tokenizer.json"},
    )


FRESH_TOP1_BATCHES = 32
"""Batches of 16 fresh inputs a top-1 agreement is read on: 512 samples, a standard error of ~1% at 0.95."""


def build(kind: str) -> ZooModel:
    torch.manual_seed(0)
    builders = {
        "mlp": lambda: build_mlp(4, 16, 3),
        "ffn": lambda: build_ffn(d_model=32, n_layers=4),
        "cnn": lambda: build_cnn(image_size=32, width=8, classes=10),
        "minilm": tiny_text,
    }
    return builders[kind]()


@pytest.fixture(scope="module", params=["mlp", "ffn", "cnn", "minilm"])
def variant(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, ZooModel, Path]:
    """(kind, zoo model, models dir) with models/<kind>/ and its int8 variant at the kind's default bound.

    Module-scoped: an export takes seconds and the tests only read what it wrote ("minilm" is the tiny
    encoder above with minilm's measure and tokenizer: the real one takes longer than this file's budget)."""
    kind, models_dir = request.param, tmp_path_factory.mktemp("models")
    zoo = build(kind)
    export(kind, zoo, models_dir, source="test")
    export_int8(kind, zoo, models_dir, "test", Bound.for_model(kind))
    return kind, zoo, models_dir


def test_int8_variant_is_its_own_smaller_model_folder(variant: tuple[str, ZooModel, Path]) -> None:
    kind, _, models_dir = variant
    fp32, int8 = load_metadata(models_dir / kind), load_metadata(models_dir / f"{kind}-int8")
    assert fp32["int8_variant"] == int8["name"] == f"{kind}-int8" and int8["fp32_model"] == kind
    assert int8["inputs"] == fp32["inputs"] and int8["outputs"] == fp32["outputs"]  # same tensors to both
    sizes = [(models_dir / name / "model.onnx").stat().st_size for name in (kind, f"{kind}-int8")]
    assert sizes[1] < sizes[0] and int8["file_bytes"] == {"fp32": sizes[0], "int8": sizes[1]}
    assert int8["precision"].startswith("int8 (") and int8["config"]["int8"] is True
    if kind == "minilm":  # a text model's variant serves with sentences in, like its FP32 model
        assert (models_dir / f"{kind}-int8" / samples.TOKENIZER_FILE).is_file()


def test_int8_graph_holds_quantized_ops_of_its_method(variant: tuple[str, ZooModel, Path]) -> None:
    kind, _, models_dir = variant
    model = onnx.load(str(models_dir / f"{kind}-int8" / "model.onnx"))
    onnx.checker.check_model(model)
    ops = {node.op_type for node in model.graph.node}
    recipe = load_metadata(models_dir / f"{kind}-int8")["quantization"]["recipe"]
    if kind == "cnn":  # convolutions: static QDQ, calibrated
        assert recipe.startswith("static QDQ") and QDQ_OPS <= ops
        weights = [i for i in model.graph.initializer if len(i.dims) == 4]
        assert weights and all(i.data_type == onnx.TensorProto.INT8 for i in weights)
    else:  # int8 weights times activations quantized per batch (or already int8: a quantized embedding table)
        assert recipe.startswith("dynamic") and "MatMulInteger" in ops and "MatMul" not in ops


def test_accuracy_is_recorded_within_its_bound_and_reproducible(variant: tuple[str, ZooModel, Path]) -> None:
    kind, zoo, models_dir = variant
    bound = Bound.for_model(kind)
    accuracy = load_metadata(models_dir / f"{kind}-int8")["accuracy"]
    assert accuracy["status"] == "checked" and accuracy["measure"] == bound.measure
    assert bound.minimum <= accuracy["figure"] < 1.0  # close to FP32, and really quantized
    assert accuracy["min_accuracy"] == bound.minimum and accuracy["samples"] > 0
    batches = samples.check_batches(zoo)
    again = compare(
        bound.measure,
        run(models_dir / kind / "model.onnx", batches),
        run(models_dir / f"{kind}-int8" / "model.onnx", batches),
    )
    assert again.figure == pytest.approx(accuracy["figure"])


def test_int8_variant_holds_its_bound_on_inputs_it_was_not_checked_on(variant: tuple[str, ZooModel, Path]) -> None:
    """Fresh inputs, drawn apart from the check set. A top-1 agreement is a share of a sample, and the tiny cnn's
    logits are close: a variant that met the bound on its checked samples can read a little under it on another
    draw (docs/variants.md). So on fresh inputs it is read with its sampling error (three binomial standard errors
    at the bound, over FRESH_TOP1_BATCHES of 16); measures that are not shares are held to the bound as they are."""
    kind, zoo, models_dir = variant
    bound = Bound.for_model(kind)
    batches = FRESH_TOP1_BATCHES if bound.measure == "top1" else 2
    with torch.random.fork_rng():
        torch.manual_seed(99)
        fresh = [{n: t.numpy() for n, t in zoo.random_inputs(16).items()} for _ in range(batches)]
    accuracy = compare(
        bound.measure,
        run(models_dir / kind / "model.onnx", fresh),
        run(models_dir / f"{kind}-int8" / "model.onnx", fresh),
    )
    if bound.measure == "top1":
        samples_drawn = accuracy.details["samples"]
        allowance = 3 * math.sqrt(bound.minimum * (1 - bound.minimum) / samples_drawn)
        assert samples_drawn == 16 * batches and accuracy.figure >= bound.minimum - allowance, accuracy
    else:
        assert accuracy.meets(bound), accuracy


@pytest.mark.parametrize("kind", ["mlp", "cnn"])  # one dynamic, one static
def test_a_variant_below_the_bound_is_refused_and_leaves_no_folder(kind: str, tmp_path: Path) -> None:
    zoo = build(kind)
    export(kind, zoo, tmp_path, source="test")
    export_int8(kind, zoo, tmp_path, "test", Bound.for_model(kind))  # a variant an earlier export left
    impossible = Bound("relative", 1.0)  # INT8 is never exact
    with pytest.raises(AccuracyBelowBound) as refused:
        export_int8(kind, zoo, tmp_path, "test", impossible)
    message = str(refused.value)
    assert message.startswith(f"the int8 variant of {kind} refused: 1 - max relative error vs FP32 0.")
    assert "< 1 (--min-accuracy)" in message and f"no {kind}-int8 written" in message and "\n" not in message
    assert sorted(p.name for p in tmp_path.iterdir()) == [kind]  # neither the old variant nor a scratch folder
    assert "int8_variant" not in load_metadata(tmp_path / kind)


def test_fp16_variant_is_held_to_the_same_measure(tmp_path: Path) -> None:
    zoo = build("mlp")
    export("mlp", zoo, tmp_path, source="test", fp16=True, bound=Bound.for_model("mlp"))
    accuracy = load_metadata(tmp_path / "mlp-fp16")["accuracy"]
    assert accuracy["status"] == "checked" and accuracy["measure"] == "relative"
    assert accuracy["min_accuracy"] <= accuracy["figure"] < 1.0
    with pytest.raises(AccuracyBelowBound, match=r"the fp16 variant of mlp refused: .* < 1 \(--min-accuracy\)"):
        export("mlp", zoo, tmp_path, source="test", fp16=True, bound=Bound("relative", 1.0))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mlp"]


def test_cli_exports_an_int8_variant_and_refuses_one_below_min_accuracy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["export", "mlp", "--hidden", "8", "--models-dir", str(tmp_path), "--int8"]
    assert cli.main(args) == 0
    out = capsys.readouterr().out
    assert f"int8 variant: {int8_folder(tmp_path, 'mlp') / 'model.onnx'} (dynamic" in out
    assert "1 - max relative error vs FP32: 0.9" in out and "(min 0.98)" in out
    assert load_metadata(tmp_path / "mlp")["int8_variant"] == "mlp-int8"

    assert cli.main([*args, "--min-accuracy", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("latlab: error: the int8 variant of mlp refused: 1 - max relative error vs FP32 0.9")
    assert err.endswith("no mlp-int8 written") and "\n" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mlp"]  # the FP32 export stands, no variant


def test_cli_int8_needs_a_pytorch_source(tiny_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    models = tmp_path / "models"
    assert cli.main(["export", "--onnx", str(tiny_model), "--name", "t", "--models-dir", str(models), "--int8"]) == 2
    assert "--int8 needs a PyTorch source" in capsys.readouterr().err
    assert cli.main(["export", "mlp", "--models-dir", str(models), "--min-accuracy", "1.5", "--int8"]) == 2
    assert "--min-accuracy must be between 0 and 1" in capsys.readouterr().err
    assert not models.exists()  # refused before anything was written
