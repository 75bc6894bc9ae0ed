"""Servers side by side: runs against different servers of the same model on the same machine merge
into one report with a server dimension, shown only when the curves come from more than one server; and a
deployment whose provider is not recorded (another server, no --provider) reads the same everywhere."""

from __future__ import annotations

import copy
import html
import re
from dataclasses import replace
from pathlib import Path

from latlab.report import best
from latlab.report.write import write_report
from latlab.loadtest.results import Curve, Run, Step, read_results, write_results
from latlab.loadtest.describe import triton_provider
from latlab.report.findings import findings_of
from latlab.report.naming import by_server, label, server_name, tag_servers
from latlab.report.verdict import provider_verdict, verdict

from .report_fixtures import CPU_NAME, cpu_run, curve, gpu_run, step

SLOS = [0.010, 0.025, 0.050, 0.100]
ENV = {"name": CPU_NAME, "cpu": "SYNTHETIC CPU", "cores": 16}


def other_server(
    name: str, version: str, steps: list[Step], provider: str | None = None, triton_batch: int | None = None
) -> Curve:
    """A deployment 'minilm' as `latlab loadtest` records it on another OIP server: no provider unless given,
    batcher settings from a Triton model config or unknown."""
    record = curve("minilm", provider or "cpu", triton_batch or 1, steps, ENV, saturated=True)
    record.server = {"name": name, "version": version}
    record.cpu = None
    record.provider = provider
    if triton_batch is None:
        record.batcher = None
        record.settings_unknown = "GET /v2/models/minilm/config answered 404"
    else:
        record.server_config = {"max_batch_size": triton_batch, "dynamic_batching": {}}
    return record


def others_run(tmp_path: Path, *deployments: Curve, run_id: str = "SYNTHETIC-others-run") -> Path:
    run = tmp_path / run_id
    write_results(
        run / "results-minilm.json",
        Run(run_id=run_id, machine={"hostname": "vm", **ENV}, deployments=list(deployments)),
    )
    return run


def mlserver(provider: str | None = None) -> Curve:
    return other_server("mlserver", "1.7.1", [step(50, 9), step(100, 30), step(200, 80, achieved=150)], provider)


def triton(provider: str | None = None) -> Curve:
    return other_server(
        "triton", "2.59.0", [step(50, 5), step(200, 12), step(400, 40, achieved=380)], provider, triton_batch=32
    )


def text_of(page: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", " ", page))


def test_a_latlab_only_report_has_no_server_dimension(tmp_path: Path) -> None:
    curves = [
        d for folder in (cpu_run(tmp_path), gpu_run(tmp_path)) for run in read_results(folder) for d in run.deployments
    ]
    assert tag_servers(curves) is curves and not by_server(curves)  # left exactly as they were
    page = write_report([cpu_run(tmp_path), gpu_run(tmp_path)], SLOS, out=tmp_path / "out").read_text()
    assert "by server" not in page and "latlab, cpu" not in page and "(latlab" not in page
    assert "minilm-cpu-b1 (cpu, batching off)" in page


def test_servers_side_by_side_in_the_answer_tables_and_labels(tmp_path: Path) -> None:
    page = write_report(
        [cpu_run(tmp_path), others_run(tmp_path, mlserver(), triton())], SLOS, out=tmp_path / "out"
    ).read_text()
    first = text_of(page.split("</section>")[0])
    assert "Compared: latlab vs MLServer vs Triton: 16 CPU cores vs provider unknown." in first
    # the answer names the best server per SLO, with what each other server's best sustains
    assert (
        "minilm, by server: at p99 ≤ 10 ms latlab, MLServer and Triton serve about as much (within 5%): "
        "latlab 50 req/s, MLServer 50 req/s, Triton 50 req/s; at p99 ≤ 25 ms latlab serves the most, 240 req/s "
        "(cpu, batching ≤ 32, wait ≤ 2 ms), Triton 200 req/s (1.2× less), MLServer 50 req/s (4.8× less); "
        "at p99 ≤ 50 ms Triton serves the most, 380 req/s (provider unknown, dynamic batcher ≤ 32, wait ≤ 2 ms), "
        "latlab 240 req/s (1.6× less), MLServer 100 req/s (3.8× less)"
    ) in first
    for heading in ("latlab, cpu (16 CPU cores)", "MLServer, provider unknown", "Triton, provider unknown"):
        assert f"<th colspan='3'>{heading}</th>" in page, heading
    # unpriced servers: the winner is the highest rate, and says so
    assert "Triton, provider unknown (higher rate (no price to compare))" in first
    assert "minilm (MLServer, provider unknown, batcher settings unknown)" in page  # the SLO table's rows
    assert "minilm (Triton, provider unknown, dynamic batcher ≤ 32, wait ≤ 2 ms)" in page
    assert "minilm-cpu-batch (latlab, cpu, batch ≤ 32, wait ≤ 2 ms)" in page
    assert "minilm (MLServer) on " in page and "minilm (Triton) on " in page  # whose steps each table holds


def test_with_a_gpu_the_cpu_vs_gpu_answer_follows_the_server_one(tmp_path: Path) -> None:
    page = write_report(
        [cpu_run(tmp_path), gpu_run(tmp_path), others_run(tmp_path, mlserver("cpu"))],
        SLOS,
        prices={"cpu": 0.80, "cuda": 2.50},
        out=tmp_path / "out",
    ).read_text()
    sentences = re.findall(r"<p class='sentence'>(.*?)</p>", page)
    assert len(sentences) == 2 and sentences[0].startswith("minilm, by server: at p99 ≤ 10 ms latlab serves the most")
    assert "the GPU (latlab, 1 NVIDIA H100 80GB HBM3" in sentences[1]
    assert "<th colspan='3'>MLServer, cpu (CPU, thread count not recorded)</th>" in page  # priced as a CPU
    assert "MLServer, cpu at 50 req/s" in page  # the evidence list names the server too


def test_an_unknown_provider_reads_the_same_in_every_text(tmp_path: Path) -> None:
    """The known wrong output: a non-latlab record without a provider was 'no CPU deployment met it' in the
    verdicts while the same report said it sustains 50 req/s, and 'the CPU (thread count not recorded)'."""
    page = text_of(write_report(others_run(tmp_path, mlserver()), SLOS, out=tmp_path / "out").read_text())
    assert "no CPU deployment met it" not in page and "thread count not recorded" not in page
    assert "no CPU measurements to compare with" not in page and "(?, " not in page
    assert (
        "minilm: at p99 ≤ 10 ms MLServer (provider unknown, batching unknown) serves 50 req/s; whether MLServer "
        "ran on a CPU or a GPU is not recorded (`latlab loadtest --provider cpu|cuda` records it), so whether a "
        "GPU pays off is unknown."
    ) in page
    assert (
        "minilm, p99 ≤ 50 ms: minilm (provider unknown, batcher settings unknown) on SYNTHETIC 16-core CPU box "
        "sustains up to 100 req/s; whether on a CPU or a GPU is not recorded"
    ) in page
    assert "Compared: MLServer: provider unknown." in page
    assert "every figure in this report comes from the CPU" not in page
    assert "No GPU measurements recorded" in page


def test_a_provider_given_with_the_run_counts_it_as_a_cpu_deployment() -> None:
    known, unknown = mlserver("cpu"), mlserver()
    assert provider_verdict(findings_of("minilm", [known], [0.05], {"cpu": 0.1}), 0.05).startswith(
        "minilm, p99 ≤ 50 ms: the CPU sustains up to 100 req/s (minilm (cpu, batcher settings unknown)"
    )
    tagged = tag_servers([known, replace(triton(), name="tri")])
    mixed = provider_verdict(findings_of("minilm", tagged, [0.05], {"cpu": 0.1}), 0.05)
    assert mixed.startswith("minilm, p99 ≤ 50 ms: the CPU sustains up to 100 req/s")
    assert "Provider unknown: tri (Triton, provider unknown, dynamic batcher ≤ 32, wait ≤ 2 ms) on " in mixed
    assert "sustains up to 380 req/s; whether on a CPU or a GPU is not recorded" in mixed
    assert label(unknown) == "minilm (provider unknown, batcher settings unknown)"


def test_server_names_and_tags() -> None:
    assert server_name(Curve("d", server={"name": "triton"})) == "Triton"
    assert server_name(Curve("d", server={"name": "mlserver"})) == "MLServer"
    assert server_name(Curve("d")) == "latlab"  # results from before the server was recorded
    assert server_name(Curve("d", server={"name": "my-oip"})) == "my-oip"
    tagged = tag_servers([mlserver(), triton()])
    assert all(c.by_server for c in tagged) and by_server(tagged)
    assert verdict(findings_of("minilm", tagged, [0.05]), 0.05).startswith(
        "minilm at p99 ≤ 50 ms: minilm (Triton, provider unknown, dynamic batcher ≤ 32, wait ≤ 2 ms) sustains 380 req/s"
    )
    assert [r.group for r in best.best_per_provider(tagged, 0.05, {})] == [
        "MLServer, provider unknown",
        "Triton, provider unknown",
    ]


def test_triton_s_instance_kind_tells_the_provider_except_for_the_python_backend() -> None:
    def config(kind: str, **extra: object) -> dict:
        return {"max_batch_size": 8, "instance_group": [{"count": 1, "kind": kind}], **extra}

    assert triton_provider(config("KIND_GPU", platform="onnxruntime_onnx")) == "cuda"
    assert triton_provider(config("KIND_GPU", platform="tensorrt_plan")) == "tensorrt"
    assert triton_provider(config("KIND_CPU", backend="onnxruntime")) == "cpu"
    assert triton_provider(config("KIND_AUTO", backend="onnxruntime")) is None
    assert triton_provider(config("KIND_CPU", backend="python")) is None  # its code picks the device (PyTriton)
    assert triton_provider({"max_batch_size": 8}) is None
    mixed = {"instance_group": [{"kind": "KIND_CPU"}, {"kind": "KIND_GPU"}]}
    assert triton_provider(mixed) is None


def test_unmerged_records_keep_their_fields(tmp_path: Path) -> None:
    """tag_servers copies: the results documents a report reads are not changed by it."""
    record = mlserver()
    before = copy.deepcopy(record)
    tag_servers([record, triton()])
    assert record == before


def test_only_a_model_served_by_more_than_one_server_is_compared_by_server(tmp_path: Path) -> None:
    ffn = replace(curve("ffn-cpu", "cpu", 1, [step(100, 5), step(200, 9)], ENV, saturated=True), model="ffn")
    latlab_ffn = others_run(tmp_path, ffn, run_id="SYNTHETIC-latlab-ffn-run")
    page = write_report(
        [cpu_run(tmp_path), latlab_ffn, others_run(tmp_path, mlserver())], SLOS, out=tmp_path / "out"
    ).read_text()
    sentences = re.findall(r"<p class='sentence'>(.*?)</p>", page)
    assert sentences[0].startswith("minilm, by server: ") and sentences[1].startswith("ffn: at p99 ≤ 10 ms the CPU")
    assert "ffn-cpu (cpu, batching off)" in page and "(latlab, cpu, batching off)" in page  # minilm's, not ffn's
