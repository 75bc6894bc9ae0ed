"""The variants a search may serve: INT8 for CPU deployments, FP16 for CUDA ones, each made from this very export
and checked against it (`latlab export --int8 / --fp16`, docs/variants.md), or the line that says why there is
none. A variant below its accuracy bound is never written, so it is never served; its figure is kept for the
report."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from latlab.lab.plan import LabPlan, ModelPlan

SUFFIX = {"int8": "-int8", "fp16": "-fp16"}
"""Where a variant of models/<name>/ lies: models/<name>-int8/ (docs/variants.md)."""
FOR_PROVIDER = {"cpu": "int8", "cuda": "fp16", "tensorrt": "fp16"}
"""The variant each provider may serve beside FP32 (INT8 through CUDA is slower, not faster: ORT's guidance)."""


@dataclass
class Variants:
    """One model's files per variant ("fp32" always), and what happened to each variant wanted."""

    paths: dict[str, Path]
    notes: dict[str, dict] = field(default_factory=dict)
    """Per variant: {"status": "made" | "found" | "refused" | "not made", "why" or "accuracy": ...}."""

    def for_provider(self, provider: str) -> dict[str, Path]:
        """The files a deployment on `provider` may serve: FP32, and the provider's variant when there is one."""
        wanted = FOR_PROVIDER.get(provider)
        return {k: v for k, v in self.paths.items() if k in ("fp32", wanted)}


def variants_on_disk(models_dir: Path, name: str, fp32: Path, provider: str) -> tuple[dict[str, Path], str]:
    """The model's variants for this provider that were made from this very export: INT8 on the CPU, FP16 on
    CUDA (`latlab export NAME --int8 / --fp16`, which refuses one that loses more accuracy than allowed); and a
    line saying what was found or why a variant on disk is not used."""
    paths = {"fp32": fp32}
    wanted = FOR_PROVIDER.get(provider, "fp16")
    found = _made_from(models_dir, name, fp32, wanted)
    if isinstance(found, str):
        return paths, found
    paths[wanted] = found
    return paths, f"{wanted} variant: {found}"


def _made_from(models_dir: Path, name: str, fp32: Path, variant: str) -> Path | str:
    """The variant's model file when its metadata says it was made from this export; else why not, in a line."""
    from latlab.export.onnx_export import load_metadata

    folder = models_dir / f"{name}{SUFFIX[variant]}"
    if not (folder / "model.onnx").is_file():
        return f"no {variant} variant ({folder} is absent: `latlab export {name} --{variant}` makes one)"
    try:
        made_from = {k: v for k, v in load_metadata(folder).get("config", {}).items() if k != variant}
        export = load_metadata(fp32.parent)
    except FileNotFoundError:
        made_from, export = None, {}
    if made_from is None or made_from != export.get("config") or export.get(f"{variant}_variant") != folder.name:
        return f"the {variant} variant in {folder} was not made from {fp32} (its metadata differs): not used"
    return (folder / "model.onnx").resolve()


def ensure_variants(models_dir: Path, plan: LabPlan, paths: dict[str, Path], say=print) -> dict[str, Variants]:
    """Each model's variants for the plan's providers, made now where they are missing (a zoo model's INT8 from
    the FP32 file on disk; its FP16, whose parity is checked against PyTorch, by exporting the model again with
    it, and then its INT8 again, since the FP32 weights changed). The user's ONNX file has no PyTorch source for
    the check set: its variants are not made, and the note says so."""
    wanted = sorted({FOR_PROVIDER[p] for p in plan.providers if p in FOR_PROVIDER})
    found = {}
    for model in plan.models:
        variants = Variants({"fp32": paths[model.name]})
        missing = []
        for variant in wanted:
            on_disk = _made_from(models_dir, model.name, paths[model.name], variant)
            if isinstance(on_disk, Path):
                variants.paths[variant] = on_disk
                variants.notes[variant] = {"status": "found", "accuracy": _accuracy(on_disk.parent)}
            else:
                missing.append(variant)
        if missing and model.onnx is not None:
            why = "your ONNX file has no PyTorch source for the check set (`latlab export --module` makes variants)"
            variants.notes.update({v: {"status": "not made", "why": why} for v in missing})
        elif missing:
            _make(models_dir, model, wanted if "fp16" in missing else missing, variants, say)
        found[model.name] = variants
    return found


def _make(models_dir: Path, model: ModelPlan, make: list[str], variants: Variants, say) -> None:
    """Write the variants `make` of a zoo model, each held to its default accuracy bound; a refused one is noted
    with its figure and never served."""
    from latlab.export.accuracy import Bound
    from latlab.export.int8 import export_int8
    from latlab.export.onnx_export import AccuracyBelowBound, export, export_fp16
    from latlab.export.zoo import BUILDERS

    zoo = BUILDERS[model.name](**model.settings)
    source = f"latlab lab: {model.name}({zoo.config})"
    bound = Bound.for_model(model.name)
    fp32 = variants.paths["fp32"]
    if "fp16" in make:
        export(model.name, zoo, models_dir, source=source)  # the weights the FP16 parity check compares with
    for variant in make:
        started = time.perf_counter()
        try:
            if variant == "int8":
                export_int8(model.name, zoo, models_dir, source, bound)
            else:
                export_fp16(model.name, zoo, fp32, models_dir, source, bound=bound)
                _name_variant(fp32.parent, "fp16", f"{model.name}{SUFFIX['fp16']}")
        except AccuracyBelowBound as exc:
            variants.notes[variant] = {"status": "refused", "why": str(exc)}
            say(f"{model.name}: {exc}")
            continue
        folder = models_dir / f"{model.name}{SUFFIX[variant]}"
        variants.paths[variant] = (folder / "model.onnx").resolve()
        variants.notes[variant] = {"status": "made", "accuracy": _accuracy(folder)}
        say(f"{model.name}: {variant} variant made in {time.perf_counter() - started:.0f} s, {_figure(folder)}")


def _name_variant(fp32_dir: Path, variant: str, folder: str) -> None:
    from latlab.export.onnx_export import load_metadata, write_metadata

    write_metadata(fp32_dir, {**load_metadata(fp32_dir), f"{variant}_variant": folder})


def _accuracy(folder: Path) -> dict:
    from latlab.export.onnx_export import load_metadata

    accuracy = load_metadata(folder).get("accuracy") or {}
    return {k: accuracy.get(k) for k in ("status", "label", "figure", "min_accuracy")}


def _figure(folder: Path) -> str:
    accuracy = _accuracy(folder)
    figure = accuracy.get("figure")
    return f"{accuracy.get('label')} {figure:.4f}" if isinstance(figure, (int, float)) else str(accuracy.get("status"))
