"""latlab/lab/variants.py: the variants the lab's search may serve are made from this very export and checked
against it; one below its bound is refused with its figure and never served; the server labels what it serves."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from latlab.export import accuracy
from latlab.lab.run import ensure_models
from latlab.lab.plan import PLANS, ModelPlan
from latlab.lab.variants import ensure_variants, variants_on_disk
from latlab.server.runtime.deployment import variant_of


def mlp_plan():
    return replace(PLANS["quick"].only(["mlp"]), bench=False)


def test_the_int8_variant_is_made_once_from_this_export_and_labelled(tmp_path: Path) -> None:
    plan = mlp_plan()
    paths = ensure_models(tmp_path, plan)
    said: list[str] = []
    made = ensure_variants(tmp_path, plan, paths, said.append)["mlp"]
    note = made.notes["int8"]
    assert note["status"] == "made" and note["accuracy"]["figure"] >= note["accuracy"]["min_accuracy"]
    assert made.for_provider("cpu") == {"fp32": paths["mlp"], "int8": (tmp_path / "mlp-int8" / "model.onnx").resolve()}
    assert made.for_provider("cuda") == {"fp32": paths["mlp"]}  # INT8 through CUDA is slower: never offered
    assert any("int8 variant made" in line for line in said)
    again = ensure_variants(tmp_path, plan, paths, said.append)["mlp"]
    assert again.notes["int8"]["status"] == "found" and again.paths == made.paths
    labelled = variant_of(made.paths["int8"])  # what the server's /config says of the deployment
    assert labelled["name"] == "int8" and labelled["of"] == "mlp"
    assert labelled["accuracy"]["figure"] == note["accuracy"]["figure"]
    assert variant_of(paths["mlp"]) is None


def test_a_variant_of_an_earlier_export_is_not_used(tmp_path: Path) -> None:
    plan = mlp_plan()
    paths = ensure_models(tmp_path, plan)
    ensure_variants(tmp_path, plan, paths)
    from latlab.export.onnx_export import export
    from latlab.export.zoo import BUILDERS

    export("mlp", BUILDERS["mlp"](), tmp_path, source="new weights, same settings")  # the int8 is now stale
    found, line = variants_on_disk(tmp_path, "mlp", paths["mlp"], "cpu")
    assert found == {"fp32": paths["mlp"]} and "not made from" in line


def test_a_variant_below_its_bound_is_refused_with_its_figure_and_never_served(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(accuracy.DEFAULT_MIN, "relative", 0.999999)  # INT8 keeps ~0.99 on mlp
    plan = mlp_plan()
    paths = ensure_models(tmp_path, plan)
    variants = ensure_variants(tmp_path, plan, paths, lambda line: None)["mlp"]
    note = variants.notes["int8"]
    assert note["status"] == "refused" and "1 - max relative error vs FP32 0.9" in note["why"]
    assert variants.for_provider("cpu") == {"fp32": paths["mlp"]}
    assert not (tmp_path / "mlp-int8").exists()


def test_your_own_onnx_file_gets_no_variant_and_the_note_says_why(tmp_path: Path, tiny_model: Path) -> None:
    plan = replace(PLANS["quick"], models=(ModelPlan("tiny", onnx=tiny_model),), bench=False)
    variants = ensure_variants(tmp_path, plan, {"tiny": tiny_model})["tiny"]
    assert variants.paths == {"fp32": tiny_model}
    assert variants.notes["int8"]["status"] == "not made" and "PyTorch source" in variants.notes["int8"]["why"]


def test_a_gpu_plan_gets_fp16_for_cuda_and_int8_for_the_cpu_from_one_export(tmp_path: Path) -> None:
    """FP16's parity is checked against PyTorch, so the model is exported again with it, and the INT8 made from
    that export; each provider is offered only its own (checked here on the CPU, where the FP16 check runs)."""
    plan = replace(mlp_plan(), providers=("cpu", "cuda"))
    paths = ensure_models(tmp_path, plan)
    variants = ensure_variants(tmp_path, plan, paths, lambda line: None)["mlp"]
    assert {v: n["status"] for v, n in variants.notes.items()} == {"fp16": "made", "int8": "made"}
    assert set(variants.for_provider("cuda")) == {"fp32", "fp16"} and set(variants.for_provider("cpu")) == {
        "fp32",
        "int8",
    }
    for variant in ("int8", "fp16"):  # both from the export now on disk
        found, _ = variants_on_disk(tmp_path, "mlp", paths["mlp"], "cpu" if variant == "int8" else "cuda")
        assert found[variant] == variants.paths[variant]
    assert variant_of(variants.paths["fp16"])["name"] == "fp16"
