"""`latlab lab` on the user's own model, before any load: each model or input the lab cannot serve stops it with
one line naming the problem and leaves no run folder; a model it can serve becomes a one-model plan."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from latlab import cli
from latlab.lab.children import write_samples
from latlab.lab.run import sweep_plan
from latlab.lab.plan import PLANS, cpu_share
from latlab.lab.user import UserModel, default_rates, plan_user_model
from latlab.loadtest.payloads import load_samples

F, I64, I32 = TensorProto.FLOAT, TensorProto.INT64, TensorProto.INT32


def identity_model(path: Path, inputs: list[tuple[str, int, list]]) -> Path:
    """Each input passed through to an output of its own, with the declared types and shapes."""
    nodes = [helper.make_node("Identity", [name], [f"{name}_out"]) for name, _, _ in inputs]
    graph = helper.make_graph(
        nodes,
        "user",
        [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
        [helper.make_tensor_value_info(f"{n}_out", t, s) for n, t, s in inputs],
    )
    return _save(graph, path)


def _save(graph: onnx.GraphProto, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), str(path))
    return path


def embedding(path: Path, vocab: int) -> Path:
    """Token ids [batch, seq] -> embeddings [batch, seq, 4] from a table of `vocab` rows."""
    table = numpy_helper.from_array(np.ones((vocab, 4), np.float32), "table")
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "ids"], ["vectors"])],
        "emb",
        [helper.make_tensor_value_info("ids", I64, ["batch", "seq"])],
        [helper.make_tensor_value_info("vectors", F, ["batch", "seq", 4])],
        initializer=[table],
    )
    return _save(graph, path)


def summed(path: Path) -> Path:
    """x [batch, 4] -> the sum of everything, a scalar: an output that does not follow the batch."""
    graph = helper.make_graph(
        [helper.make_node("ReduceSum", ["x"], ["total"], keepdims=0)],
        "sum",
        [helper.make_tensor_value_info("x", F, ["batch", 4])],
        [helper.make_tensor_value_info("total", F, [])],
    )
    return _save(graph, path)


SEQ = [("ids", I64, ["batch", "seq"]), ("mask", I64, ["batch", "seq"])]


def lab(tmp_path: Path, capsys: pytest.CaptureFixture[str], *args: str) -> str:
    """Run `latlab lab` with args; it must refuse with exit 2 and one line, before making a run folder."""
    status = cli.main(["lab", "--runs-dir", str(tmp_path / "runs"), "--models-dir", str(tmp_path / "models"), *args])
    err = capsys.readouterr().err.strip()
    assert status == 2, err
    assert len(err.splitlines()) == 1 and err.startswith("latlab: error: ") and "Traceback" not in err
    assert not (tmp_path / "runs").exists()
    return err


def samples(tmp_path: Path, **arrays: np.ndarray) -> str:
    path = tmp_path / "samples.npz"
    np.savez(path, **arrays)
    return str(path)


@pytest.mark.parametrize(
    "inputs, message",
    [
        ([("x", F, [1, 4])], "input 'x' has no batch axis: its first axis is fixed at 1"),
        ([("x", F, [])], "input 'x' is a scalar: it has no batch axis"),
        ([("x", TensorProto.STRING, ["batch"])], "input 'x' has type tensor(string), which the lab cannot generate"),
        ([("x", TensorProto.BFLOAT16, ["batch", 4])], "tensor 'x' has type tensor(bfloat16)"),
        (SEQ, "input 'ids' axis 1 ('seq') is dynamic: give its size with --dim seq=N"),
        ([("x", F, ["batch", None])], "input 'x' axis 1 is dynamic and unnamed: give its size with --dim x:1=N"),
    ],
)
def test_a_model_the_lab_cannot_serve_stops_it_with_one_line(tmp_path, capsys, inputs, message) -> None:
    model = identity_model(tmp_path / "mine.onnx", inputs)
    assert message in lab(tmp_path, capsys, "--onnx", str(model))


@pytest.mark.parametrize(
    "dims, message",
    [
        (["seq"], "--dim 'seq': write NAME=SIZE with a positive size"),
        (["seq=0"], "write NAME=SIZE with a positive size"),
        (["seq=8", "batch=4"], "--dim batch: 'batch' is the batch axis, which the lab sets itself"),
        (
            ["seq=8", "words=4"],
            "--dim words: the model has no dynamic axis of that name; its dynamic axes besides the batch: seq",
        ),
    ],
)
def test_a_dim_that_names_no_axis_or_no_size_is_refused(tmp_path, capsys, dims, message) -> None:
    model = identity_model(tmp_path / "mine.onnx", SEQ)
    assert message in lab(tmp_path, capsys, "--onnx", str(model), *[a for d in dims for a in ("--dim", d)])


@pytest.mark.parametrize(
    "arrays, extra, message",
    [
        ({"ids": np.zeros((3, 5), np.int64)}, [], "must hold the model's inputs ['ids', 'mask']: missing ['mask']"),
        (
            {"ids": np.zeros((3, 5), np.int64), "mask": np.ones((3, 5), np.int64), "x": np.ones((3, 1), np.float32)},
            [],
            "unknown ['x']",
        ),
        (
            {"ids": np.zeros((3, 5), np.int32), "mask": np.ones((3, 5), np.int64)},
            [],
            "input 'ids' is INT64, but its samples are int32",
        ),
        (
            {"ids": np.zeros((3, 5, 1), np.int64), "mask": np.ones((3, 5), np.int64)},
            [],
            "input 'ids' has shape [-1, -1] (-1: any), but its samples have [3, 5, 1]",
        ),
        (
            {"ids": np.zeros((3, 5), np.int64), "mask": np.ones((3, 6), np.int64)},
            [],
            "inputs 'ids' and 'mask' share the axis 'seq', but their samples have 5 and 6 on it",
        ),
        (
            {"ids": np.zeros((3, 5), np.int64), "mask": np.ones((2, 5), np.int64)},
            [],
            "every array needs the same number of rows",
        ),
        (
            {"ids": np.zeros((3, 5), np.int64), "mask": np.ones((3, 5), np.int64)},
            ["--dim", "seq=6"],
            "--dim seq=6, but the samples of input 'ids' have 5 on axis 1",
        ),
    ],
)
def test_a_sample_file_that_does_not_fit_the_model_is_refused(tmp_path, capsys, arrays, extra, message) -> None:
    model = identity_model(tmp_path / "mine.onnx", SEQ)
    assert message in lab(tmp_path, capsys, "--onnx", str(model), "--inputs", samples(tmp_path, **arrays), *extra)


def test_a_sample_file_that_is_not_an_npz_of_arrays_is_refused(tmp_path, capsys) -> None:
    model = identity_model(tmp_path / "mine.onnx", SEQ)
    assert "sample file" in lab(tmp_path, capsys, "--onnx", str(model), "--inputs", str(model))
    assert "does not exist" in lab(tmp_path, capsys, "--onnx", str(model), "--inputs", str(tmp_path / "no.npz"))
    np.save(tmp_path / "one.npy", np.zeros((2, 3)))
    assert "one unnamed array" in lab(tmp_path, capsys, "--onnx", str(model), "--inputs", str(tmp_path / "one.npy"))


def test_a_provider_that_does_not_load_is_named(tmp_path, capsys, monkeypatch) -> None:
    # ORT falls back to the CPU silently; the lab must refuse to serve under CUDA's name. Reported as a fallback on
    # every machine (on a GPU box CUDA would load), as ORT reports one where CUDA's libraries are missing.
    monkeypatch.setattr(ort.InferenceSession, "get_providers", lambda self: ["CPUExecutionProvider"])
    model = identity_model(tmp_path / "mine.onnx", [("x", F, ["batch", 4])])
    err = lab(tmp_path, capsys, "--onnx", str(model), "--providers", "cpu,cuda")
    assert "cannot serve it on cuda" in err and "asked for CUDAExecutionProvider" in err
    assert "--providers: write some of cpu, cuda, tensorrt" in lab(
        tmp_path, capsys, "--onnx", str(model), "--providers", "gpu"
    )


def test_a_model_that_fails_on_the_generated_inputs_says_to_give_real_ones(tmp_path, capsys) -> None:
    model = embedding(tmp_path / "emb.onnx", vocab=10)  # generated ids run to 99
    err = lab(tmp_path, capsys, "--onnx", str(model), "--dim", "seq=4")
    assert "the model fails on cpu at batch 1" in err and "--inputs samples.npz" in err


def test_an_output_that_does_not_follow_the_batch_is_refused(tmp_path, capsys) -> None:
    err = lab(tmp_path, capsys, "--onnx", str(summed(tmp_path / "sum.onnx")))
    assert "output(s) total do not follow the batch axis" in err


def test_sources_and_options_are_checked_before_any_work(tmp_path, capsys) -> None:
    model = identity_model(tmp_path / "mine.onnx", [("x", F, ["batch", 4])])
    assert "--onnx: " in lab(tmp_path, capsys, "--onnx", str(tmp_path / "missing.onnx"))
    garbage = tmp_path / "garbage.onnx"
    garbage.write_bytes(b"not a model")
    assert "cannot serve it on cpu" in lab(tmp_path, capsys, "--onnx", str(garbage))
    assert "export it first" in lab(tmp_path, capsys, "--model", "never-exported")
    assert "--module needs --name" in lab(tmp_path, capsys, "--module", "tests.export.factories:two_inputs")
    assert "name one model" in lab(tmp_path, capsys, "--onnx", str(model), "--model", "mine")
    assert "must be letters, digits" in lab(tmp_path, capsys, "--onnx", str(model), "--name", "my model")
    assert "taken by the run folder's own" in lab(tmp_path, capsys, "--onnx", str(model), "--name", "prometheus")
    assert "are for your own model" in lab(tmp_path, capsys, "--rates", "4")
    assert "write --dim seq=SPEC" in lab(tmp_path, capsys, "--dim", "x:1=4")  # the zoo's sizes: one spec for all
    assert "not one of" in lab(tmp_path, capsys, "--dim", "seq=lognormal:5")
    assert "every --traffic profile must be a trace" in lab(tmp_path, capsys, "--dim", "seq=trace:ContextTokens")
    assert "--models picks the plan's zoo models" in lab(tmp_path, capsys, "--onnx", str(model), "--models", "mlp")
    assert "--slo: cannot read" in lab(tmp_path, capsys, "--onnx", str(model), "--slo", "soon")
    assert "--price: cannot read" in lab(tmp_path, capsys, "--onnx", str(model), "--price", "cpu=cheap")
    assert "--rates must be positive" in lab(tmp_path, capsys, "--onnx", str(model), "--rates", "0")
    assert "--slo-seconds must be >= 0" in lab(tmp_path, capsys, "--onnx", str(model), "--slo-seconds", "-1")
    assert "--slo-steps must be >= 0" in lab(tmp_path, capsys, "--onnx", str(model), "--slo-steps", "-1")


def test_a_servable_model_becomes_a_one_model_plan_with_inputs_from_its_declared_shapes(tmp_path) -> None:
    model = identity_model(tmp_path / "tokens" / "model.onnx", [*SEQ, ("scale", F, ["batch", 3])])
    user = UserModel(onnx=model, dims=("seq=128",), providers="cpu")
    plan = plan_user_model(PLANS["quick"], user, tmp_path / "models", cpu_share(2))
    (planned,) = plan.models
    assert planned.name == "tokens" and planned.onnx == model.resolve()  # model.onnx is named after its folder
    assert plan.providers == ("cpu",) and not plan.bench and plan.step_seconds == PLANS["quick"].step_seconds
    shapes = {n: (a.shape[1:], a.dtype) for n, a in planned.samples.items()}
    assert shapes == {"ids": ((128,), np.int64), "mask": ((128,), np.int64), "scale": ((3,), np.float32)}
    assert (planned.samples["mask"] == 1).all() and 0 <= planned.samples["ids"].min() <= planned.samples[
        "ids"
    ].max() < 100
    assert planned.rates == tuple(sorted(planned.rates)) and len(planned.rates) >= 2
    write_samples(tmp_path / "run", plan)  # the sweep sends what the run folder holds
    sweep = sweep_plan(tmp_path / "run", plan, planned, "http://127.0.0.1:1", 9646)
    sent = load_samples(sweep.workload.payload.inputs)
    assert {n: a.shape for n, a in sent.items()} == {n: a.shape for n, a in planned.samples.items()}


def test_axes_an_exporter_named_question_mark_go_by_position_and_can_differ(tmp_path, capsys) -> None:
    """Some exporters name every dynamic axis '?': an image model's height and width then get sizes of their
    own by INPUT:AXIS (ORT reads the '?' names back as they are)."""
    model = identity_model(tmp_path / "image" / "model.onnx", [("pixels", F, ["batch", 3, "?", "?"])])
    assert [i.shape for i in ort.InferenceSession(str(model)).get_inputs()] == [["batch", 3, "?", "?"]]
    user = UserModel(onnx=model, dims=("pixels:2=32", "pixels:3=48"), providers="cpu")
    (planned,) = plan_user_model(PLANS["quick"], user, tmp_path / "models", cpu_share(2)).models
    assert planned.samples["pixels"].shape[1:] == (3, 32, 48)
    message = lab(tmp_path, capsys, "--onnx", str(model), "--dim", "pixels:2=32")
    assert "input 'pixels' axis 3 is dynamic and unnamed: give its size with --dim pixels:3=N" in message
    message = lab(tmp_path, capsys, "--onnx", str(model), "--dim", "?=32")
    assert "--dim ?: the model has no dynamic axis of that name; its dynamic axes besides the batch: " in message
    assert "pixels:2, pixels:3" in message


def test_a_named_axis_can_also_be_given_by_position(tmp_path, capsys) -> None:
    model = identity_model(tmp_path / "tokens" / "model.onnx", SEQ)
    user = UserModel(onnx=model, dims=("ids:1=12",), providers="cpu")
    (planned,) = plan_user_model(PLANS["quick"], user, tmp_path / "models", cpu_share(2)).models
    assert planned.samples["ids"].shape[1:] == (12,) and planned.samples["mask"].shape[1:] == (12,)
    message = lab(tmp_path, capsys, "--onnx", str(model), "--dim", "ids:1=12", "--dim", "seq=16")
    assert "--dim seq=16, but the axis 'seq' is also given 12" in message


def test_samples_give_the_dynamic_axes_their_size_without_dim(tmp_path) -> None:
    model = identity_model(tmp_path / "mine.onnx", SEQ)
    ids = np.arange(40 * 7, dtype=np.int64).reshape(40, 7)
    path = samples(tmp_path, ids=ids, mask=np.ones((40, 7), np.int64))
    plan = plan_user_model(
        PLANS["cpu"],
        UserModel(onnx=model, inputs=Path(path), providers="cpu", rates="5,10"),
        tmp_path / "models",
        cpu_share(2),
    )
    (planned,) = plan.models
    assert planned.name == "mine" and planned.rates == (5, 10)
    np.testing.assert_array_equal(planned.samples["ids"], ids[:32])  # the first rows, as many as requests vary over


def test_an_exported_model_and_a_module_are_found_by_name(tmp_path) -> None:
    models = tmp_path / "models"
    identity_model(models / "mine" / "model.onnx", [("x", F, ["batch", 4])])
    plan = plan_user_model(PLANS["cpu"], UserModel(exported="mine", providers="cpu"), models, cpu_share(2))
    assert plan.models[0].name == "mine" and plan.models[0].onnx == (models / "mine" / "model.onnx").resolve()
    plan = plan_user_model(
        PLANS["cpu"],
        UserModel(module="tests.export.factories:two_inputs", name="two", providers="cpu"),
        models,
        cpu_share(2),
    )
    assert plan.models[0].onnx == (models / "two" / "model.onnx").resolve()  # exported first, as `latlab export`
    assert set(plan.models[0].samples) == {"a", "b"}


def test_default_rates_follow_the_models_batch1_time() -> None:
    fast, slow = default_rates(0.1e-3), default_rates(30e-3)
    assert fast == tuple(sorted(fast)) and len(fast) == 4 and 1000 < fast[-1] < 3000
    assert slow[-1] < 40 and min(slow) >= 1
    assert default_rates(10.0) == (1.0,)  # a model slower than a second a request starts at 1 req/s
