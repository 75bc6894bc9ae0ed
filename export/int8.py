"""The int8 variant of an exported model, for CPU deployments, made with ONNX Runtime's own quantization tools.

It is written as its own model folder, models/<name>-int8/ (model.onnx + metadata.json, and the
tokenizer for a text model), so a serving config deploys it like any other model. Inputs and outputs
stay FP32: clients send the same tensors to both.

The method follows ONNX Runtime's advice: a graph with convolutions is quantized statically (QDQ,
activation ranges calibrated on seeded inputs, U8 activations and S8 weights, the pair x86 runs fast);
any other graph dynamically (S8 weights ahead of time, activation ranges taken per batch at run time).
Recipes go from fastest to most accurate, and the first whose accuracy meets the bound is written:
per-tensor weights, then per-channel ones, each first as is and then with the last weighted node kept
in FP32 (static QDQ would otherwise round the model's answer itself to 256 levels: the top two logits
of the untrained zoo ResNet lie closer than that step, and keeping its classifier halves the largest
logit error), then per-channel with the last and the first 1, 2, 4 or 8 weighted nodes in FP32 (an
error made early passes through every later layer). Measured and left out (see
docs/variants.md): `quant_pre_process` (no change in accuracy or speed on cnn and minilm, and its
symbolic shape inference fails on minilm's graph) and S8 activations (static cnn 1.3x faster than FP32
against 3.4x with U8 on this machine's AVX512-VNNI EPYC).
"""

from __future__ import annotations

import contextlib
import logging
import platform
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import onnx
import onnxruntime as ort
from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_dynamic, quantize_static

from latlab.export import samples
from latlab.export.accuracy import Accuracy, Bound, compare, run
from latlab.export.onnx_export import (
    MODEL_FILE,
    AccuracyBelowBound,
    ExportError,
    describe,
    load_metadata,
    staged_variant,
    write_metadata,
)
from latlab.export.zoo_model import ZooModel

INT8_SUFFIX = "-int8"
WEIGHTED_OPS = ("MatMul", "Gemm", "Conv")
KEEP_FIRST_STEPS = (1, 2, 4, 8)
# past a quarter of its weighted nodes in FP32 a variant is no longer the int8 model it says it is
MAX_KEPT_SHARE = 0.25
QUANTIZED_OPS = frozenset(
    {
        "QuantizeLinear",
        "DequantizeLinear",
        "DynamicQuantizeLinear",
        "MatMulInteger",
        "ConvInteger",
        "DynamicQuantizeMatMul",
        "QLinearConv",
        "QLinearMatMul",
        "QGemm",
    }
)


@dataclass(frozen=True)
class Recipe:
    """One way to quantize a graph with onnxruntime.quantization."""

    static: bool
    """Static QDQ with calibrated activation ranges (graphs with convolutions); dynamic otherwise."""
    per_channel: bool
    """One weight scale per output channel rather than one per tensor: slower on small layers, closer to FP32."""
    keep_last: bool = False
    """The last weighted node (MatMul, Gemm, Conv: the one nearest the outputs) stays in FP32."""
    keep_first: int = 0
    """How many weighted nodes, counted from the graph's inputs, stay in FP32."""

    def describe(self) -> str:
        ends = (["the last"] if self.keep_last else []) + ([f"the first {self.keep_first}"] if self.keep_first else [])
        kept = " and ".join(ends)
        nodes = "node" if kept == "the last" else "nodes"
        return (
            f"{'static QDQ' if self.static else 'dynamic'}, {'per-channel' if self.per_channel else 'per-tensor'} "
            f"weights{f', {kept} weighted {nodes} in FP32' if kept else ''}"
        )

    def kept(self, weighted: list[str]) -> list[str]:
        """The names, among the graph's weighted nodes in order, that this recipe leaves in FP32."""
        first = weighted[: self.keep_first]
        return first + (weighted[-1:] if self.keep_last and len(first) < len(weighted) else [])


def recipes(static: bool, weighted: int) -> list[Recipe]:
    """The recipes in the order they are tried, fastest first, for a graph with `weighted` weighted nodes."""
    ladder = [Recipe(static, per_channel, keep_last) for per_channel in (False, True) for keep_last in (False, True)]
    ladder += [Recipe(static, True, True, first) for first in KEEP_FIRST_STEPS]
    return [r for r in ladder if len(r.kept([""] * weighted)) <= MAX_KEPT_SHARE * weighted]


def int8_folder(models_dir: Path, name: str) -> Path:
    """Where the int8 variant of model `name` goes."""
    return Path(models_dir) / f"{name}{INT8_SUFFIX}"


def export_int8(name: str, zoo: ZooModel, models_dir: Path, source: str, bound: Bound) -> dict:
    """Quantize models_dir/name/model.onnx into models_dir/name-int8/ with the fastest recipe that meets `bound`.

    AccuracyBelowBound, and no int8 folder left, when none does. The FP32 model's metadata names the variant."""
    fp32_dir = Path(models_dir) / name
    fp32_meta = {k: v for k, v in load_metadata(fp32_dir).items() if k != "int8_variant"}
    write_metadata(fp32_dir, fp32_meta)  # no variant is named until a new one has passed
    with staged_variant(int8_folder(models_dir, name)) as scratch:
        metadata = _write_int8(name, zoo, fp32_dir, scratch, source, bound)
        write_metadata(scratch, metadata)
    write_metadata(fp32_dir, {**fp32_meta, "int8_variant": metadata["name"]})
    return metadata


def _write_int8(name: str, zoo: ZooModel, fp32_dir: Path, out_dir: Path, source: str, bound: Bound) -> dict:
    fp32_path, path = fp32_dir / MODEL_FILE, out_dir / MODEL_FILE
    model = _prepared(fp32_path)
    static = any(node.op_type == "Conv" for node in model.graph.node)
    batches = samples.check_batches(zoo)
    reference = run(fp32_path, batches)
    calibration = samples.calibration_batches(zoo) if static else []
    tried: list[tuple[Recipe, Accuracy]] = []
    weighted = _weighted(model)
    for recipe in recipes(static, len(weighted)):
        quantize(model, path, recipe.kept(weighted), recipe, calibration)
        tried.append((recipe, compare(bound.measure, reference, run(path, batches))))
        if tried[-1][1].meets(bound):
            break
    else:
        recipe, best = max(tried, key=lambda pair: pair[1].figure)
        raise AccuracyBelowBound(
            f"{best.shortfall(f'the int8 variant of {name}', bound)}, the best of {len(tried)} "
            f"recipes ({recipe.describe()}); no {int8_folder(Path(), name)} written"
        )
    _require_quantized(onnx.load(str(path), load_external_data=False), name)
    for relative, src in zoo.files.items():  # a text model's tokenizer, so it serves with sentences in
        (out_dir / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, out_dir / relative)
    return _metadata(
        name,
        zoo,
        source,
        fp32_path,
        path,
        tried,
        tried[-1][0].kept(weighted),
        bound,
        samples.describe(zoo, batches),
        len(calibration),
    )


def quantize(model: onnx.ModelProto, path: Path, kept: list[str], recipe: Recipe, calibration: samples.Batches) -> None:
    """Write `model` quantized by `recipe` to `path`, the nodes named in `kept` left in FP32 (calibrated on
    `calibration` when the recipe is static)."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)  # the quantizers rewrite the graph they are given
    # the dynamic quantizer renames a Gemm it rewrites as MatMul + Add `<name>_MatMul`: exclude either name
    exclude = kept + [f"{node}_MatMul" for node in kept]
    with _quiet():  # ORT logs advice at WARNING on the root logger ("consider pre-processing"): measured, declined
        if recipe.static:
            quantize_static(
                copy,
                path,
                _Reader(calibration),
                quant_format=QuantFormat.QDQ,
                per_channel=recipe.per_channel,
                reduce_range=_needs_reduce_range(),
                activation_type=QuantType.QUInt8,
                weight_type=QuantType.QInt8,
                nodes_to_exclude=exclude,
            )
        else:
            quantize_dynamic(
                copy,
                path,
                weight_type=QuantType.QInt8,
                per_channel=recipe.per_channel,
                reduce_range=_needs_reduce_range(),
                nodes_to_exclude=exclude,
            )


def _prepared(fp32_path: Path) -> onnx.ModelProto:
    """The FP32 graph without its recorded shapes: the dynamic quantizer turns Gemm (B transposed) into MatMul,
    the exporter's shapes of the old weights then contradict the new ones and ORT's shape inference stops."""
    model = onnx.load(str(fp32_path))
    del model.graph.value_info[:]
    return model


def _weighted(model: onnx.ModelProto) -> list[str]:
    """Names of the nodes with a constant weight, in graph order (the order they run in)."""
    constants = {init.name for init in model.graph.initializer}
    return [n.name for n in model.graph.node if n.op_type in WEIGHTED_OPS and n.input[1:2] and n.input[1] in constants]


def _needs_reduce_range() -> bool:
    """7-bit weights on x86 CPUs without VNNI, where U8S8 products can saturate (ORT's advice)."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    try:
        return "vnni" not in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


def _require_quantized(model: onnx.ModelProto, name: str) -> None:
    if not any(node.op_type in QUANTIZED_OPS for node in model.graph.node):
        raise ExportError(
            f"{name}: ONNX Runtime found nothing to quantize (no MatMul, Gemm or Conv with constant "
            f"weights); no int8 variant written"
        )


class _Reader(CalibrationDataReader):
    """The calibration batches, one at a time, as quantize_static asks for them."""

    def __init__(self, batches: samples.Batches) -> None:
        self._batches = iter(batches)

    def get_next(self) -> dict | None:
        return next(self._batches, None)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        yield
    finally:
        root.setLevel(level)


def _metadata(
    name: str,
    zoo: ZooModel,
    source: str,
    fp32_path: Path,
    path: Path,
    tried: list[tuple[Recipe, Accuracy]],
    kept_fp32: list[str],
    bound: Bound,
    inputs: str,
    calibrated_on: int,
) -> dict:
    recipe, accuracy = tried[-1]
    graph = onnx.load(str(path), load_external_data=False)
    return {
        "name": int8_folder(Path(), name).name,
        "source": f"{source}, quantized to int8",
        "config": {**zoo.config, "int8": True},
        **describe(graph, zoo.extras.get("flops_at")),
        "params": sum(p.numel() for p in zoo.module.parameters()),
        "precision": f"int8 ({recipe.describe()}); inputs and outputs FP32",
        "fp32_model": name,
        "external_data": False,
        "file_bytes": {"int8": path.stat().st_size, "fp32": fp32_path.stat().st_size},
        "quantization": {
            "tool": f"onnxruntime.quantization {ort.__version__}",
            "recipe": recipe.describe(),
            "activations": (
                f"U8 per tensor, ranges calibrated (MinMax) on {calibrated_on} batches of {samples.BATCH}"
                if recipe.static
                else "U8 per tensor, range taken from each batch at run time"
            ),
            "weights": f"S8 {'per channel' if recipe.per_channel else 'per tensor'}"
            f"{', 7-bit (reduce_range: no VNNI here)' if _needs_reduce_range() else ''}",
            "kept_fp32": kept_fp32,
            "tried": [{"recipe": r.describe(), "figure": a.figure} for r, a in tried],
        },
        "accuracy": accuracy.record(bound, provider="CPUExecutionProvider", inputs=inputs),
        **{k: v for k, v in zoo.extras.items() if k != "flops_at"},
    }
