"""The lab serves minilm both ways: token-id deployments and text deployments (the export's tokenizer), on
every provider of the plan; the server config it writes gives only the text ones a [deployments.tokenizer]."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from latlab.common.settings import CpuOptions
from latlab.lab.run import write_config
from latlab.lab.plan import MINILM, MLP, PLANS, LabPlan
from latlab.server.config import load_config
from tests.text_models import TOKENIZER


def test_minilm_is_planned_with_token_ids_and_with_text_on_every_provider() -> None:
    assert [name for name, _, _ in LabPlan(models=(MINILM,)).deployments(MINILM)] == [
        "minilm-b1",
        "minilm-batch",
        "minilm-text-b1",
        "minilm-text-batch",
    ]
    gpu = PLANS["gpu"]
    (minilm,) = [m for m in gpu.models if m.name == "minilm"]
    names = {(name, provider) for name, provider, _ in gpu.deployments(minilm)}
    assert {("minilm-text-cuda-batch", "cuda"), ("minilm-text-cpu-b1", "cpu"), ("minilm-cuda-b1", "cuda")} <= names
    assert len(names) == 8
    assert [name for name, _, _ in PLANS["cpu"].deployments(MLP)] == ["mlp-b1", "mlp-batch"]  # no text for mlp
    (cpu_minilm,) = [m for m in PLANS["cpu"].models if m.name == "minilm"]
    assert not cpu_minilm.text  # the main job's time goes to the search; text is measured by its own benchmark


def test_a_searched_deployment_takes_the_place_of_its_providers_batching_on_one() -> None:
    """The search starts from the plan's batching-on settings and measures them in every variant; its best is
    swept in their place, on its provider only; batching off (the export, FP32) stays as the baseline, and so
    does the text deployment (the search tunes token ids)."""
    tuned = ({"name": "minilm-cuda-tuned", "provider": "cuda"},)
    plan = replace(PLANS["gpu"], models=(replace(MINILM, tuned=tuned),))
    names = plan.deployment_names(plan.models[0])
    assert "minilm-cuda-batch" not in names and names[-1] == "minilm-cuda-tuned"
    assert {"minilm-cuda-b1", "minilm-cpu-batch", "minilm-text-cuda-batch"} <= set(names) and len(names) == 8
    cpu = replace(PLANS["cpu"], models=(replace(MLP, tuned=({"name": "mlp-tuned", "provider": "cpu"},)),))
    assert cpu.deployment_names(cpu.models[0]) == ["mlp-b1", "mlp-tuned"]


def export_like(folder: Path, with_text_deployment: bool) -> Path:
    """What `latlab export minilm` leaves behind, without the 90 MB model: metadata and the tokenizer."""
    (folder / "tokenizer").mkdir(parents=True)
    shutil.copy(TOKENIZER, folder / "tokenizer" / "tokenizer.json")
    meta = {"tokenizer": {"folder": "tokenizer", "max_seq_length": 256}}
    if with_text_deployment:
        meta["text_deployment"] = {"tokenizer": {"file": "tokenizer/tokenizer.json", "max_length": 128}}
    (folder / "metadata.json").write_text(json.dumps(meta))
    (folder / "model.onnx").write_bytes(b"")
    return folder / "model.onnx"


def test_the_lab_config_gives_text_deployments_the_exports_tokenizer(tmp_path: Path) -> None:
    for with_text, max_length in ((True, 128), (False, 256)):  # an older export: its max_seq_length
        folder = tmp_path / str(with_text)
        model = export_like(folder / "minilm", with_text)
        config = load_config(write_config(folder, {"minilm": model}, 8000, LabPlan(models=(MINILM,))))
        tokenizers = {d.name: d.tokenizer for d in config.deployments}
        assert tokenizers["minilm-b1"] is None and tokenizers["minilm-batch"] is None
        for name in ("minilm-text-b1", "minilm-text-batch"):
            assert tokenizers[name].file == folder / "minilm" / "tokenizer" / "tokenizer.json"
            assert tokenizers[name].max_length == max_length
        assert {d.model for d in config.deployments} == {"minilm"}


@pytest.mark.parametrize("plan", PLANS)
def test_every_plans_config_loads_from_a_folder_toml_must_escape(tmp_path: Path, plan: str) -> None:
    """Model and tokenizer paths with quotes, a backslash and spaces, and a string among the CPU settings."""
    folder = tmp_path / 'my "models"\\ here'
    models = {m.name: export_like(folder / m.name, with_text_deployment=True) for m in PLANS[plan].models}
    lab_plan = replace(PLANS[plan], cpu=CpuOptions.partial(allow_spinning=False, execution_mode="parallel"))
    config = load_config(write_config(tmp_path, models, 8000, lab_plan), environ={})
    assert len(config.deployments) == sum(len(lab_plan.deployments(m)) for m in lab_plan.models)
    assert {d.model_path for d in config.deployments} == set(models.values())
    assert all(
        d.cpu.execution_mode == "parallel" and not d.cpu.allow_spinning
        for d in config.deployments
        if d.provider == "cpu"
    )
    texts = {folder / "minilm" / "tokenizer" / "tokenizer.json"} if any(m.text for m in lab_plan.models) else set()
    assert {d.tokenizer.file for d in config.deployments if d.tokenizer} == texts
