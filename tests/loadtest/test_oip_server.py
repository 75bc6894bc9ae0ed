"""The load tester against any Open Inference Protocol server: Triton's standard counters mapped into a
step's server figures (against a /metrics text captured from Triton 2.x), and latlab's extras (/config, the
observer port, latlab_* series) optional: used where present, their absence said once, never fatal."""

from __future__ import annotations

import pytest

from latlab.report import breakdown, pictures
from latlab.report.findings import findings_of
from latlab.loadtest.results import Curve
from latlab.loadtest.describe import describe, extras_notice, triton_batcher
from latlab.loadtest.scrape import MetricsSource, average_batch, batch_totals, metrics_source, server_step

from tests.loadtest.steps import simulated
from tests.loadtest.stub_server import TRITON_METRICS, StubModel, advance, stub_server

CAPTURED = TRITON_METRICS.read_text()
"""Triton's /metrics with models ffn (dynamic batcher) and ffn_b64 after a while of serving."""


def later(
    requests: int = 400,
    executions: int = 100,
    rejected: int = 3,
    request_us: float = 8000.0,
    queue_us: float = 2500.0,
    input_us: float = 200.0,
    infer_us: float = 4000.0,
    output_us: float = 100.0,
) -> str:
    """The captured text after ffn served `requests` more in `executions` runs, each request with these times."""
    return advance(
        CAPTURED,
        "ffn",
        {
            "nv_inference_request_success": requests,
            "nv_inference_count": requests,
            "nv_inference_exec_count": executions,
            "nv_inference_request_failure": rejected,
            "nv_inference_request_duration_us": requests * request_us,
            "nv_inference_queue_duration_us": requests * queue_us,
            "nv_inference_compute_input_duration_us": requests * input_us,
            "nv_inference_compute_infer_duration_us": requests * infer_us,
            "nv_inference_compute_output_duration_us": requests * output_us,
        },
    )


def test_triton_counters_give_per_request_times_between_two_snapshots() -> None:
    figures = server_step((100.0, CAPTURED), (104.0, later()), "ffn")
    assert figures["source"] == "triton" and figures["seconds"] == 4.0
    assert figures["request_s"] == pytest.approx(0.008)
    assert figures["queue_s"] == pytest.approx(0.0025)
    assert figures["input_transfer_s"] == pytest.approx(0.0002)
    assert figures["output_transfer_s"] == pytest.approx(0.0001)
    # latlab's compute times a run with its transfers; the breakdown takes them out again
    assert figures["compute_s"] == pytest.approx(0.0043)
    assert figures["ok_count"] == 400 and figures["rejected_count"] == 3 and figures["request_count"] == 400
    assert figures["busy_s"] == pytest.approx(0.0043 * 100) and figures["busy_share"] == pytest.approx(0.43 / 4)
    assert figures["process_cpu_cores"] is None  # Triton exports no process CPU: the server-bound rule says unknown
    split = breakdown.parts(figures)
    assert split["queue"] == pytest.approx(0.0025) and split["compute"] == pytest.approx(0.004)
    assert split["input_transfer"] == pytest.approx(0.0002) and split["output_transfer"] == pytest.approx(0.0001)
    assert split["rest"] == pytest.approx(0.008 - 0.0025 - 0.0002 - 0.004 - 0.0001)
    assert sum(split.values()) == pytest.approx(0.008)


def test_triton_busy_time_estimated_from_per_request_runs_never_exceeds_the_step() -> None:
    """Batched requests each record their batch's whole run, so the mean run per request times the executions
    overstates the busy time when batch sizes vary: 400 requests of 9 ms mean run over 100 executions would be
    0.9 s busy in a 0.5 s step. One instance cannot run more than the step lasted."""
    figures = server_step((100.0, CAPTURED), (100.5, later(infer_us=9000, input_us=0, output_us=0)), "ffn")
    assert figures["busy_s"] == pytest.approx(0.5) and figures["busy_share"] == pytest.approx(1.0)
    reported = {**figures, "busy_s": 0.9}  # a results file written before the cap
    assert breakdown.busy_share(reported, Curve("ffn")) == 1.0
    latlab_own = {**reported, "source": None}  # latlab's own compute histogram times each run once: no cap
    assert breakdown.busy_share(latlab_own, Curve("ffn")) == pytest.approx(1.8)


def test_average_batch_from_triton_inference_and_execution_counts() -> None:
    before, after = batch_totals(CAPTURED, "ffn"), batch_totals(later(requests=400, executions=50), "ffn")
    assert before == (84213.0, 21377.0)
    assert average_batch(before, after) == pytest.approx(8.0)
    assert batch_totals(CAPTURED, "ffn_b64") == (40960.0, 1024.0)  # another model's counters are its own


def test_other_models_and_idle_steps_give_no_triton_figures() -> None:
    after = later()
    other = server_step((1.0, CAPTURED), (2.0, after), "ffn_b64")  # ffn_b64 served nothing in between
    assert "request_s" not in other and "source" not in other and other["busy_s"] is None
    assert breakdown.parts(other) is None
    absent = server_step((1.0, CAPTURED), (2.0, after), "resnet")
    assert "request_s" not in absent and absent["busy_share"] is None
    assert average_batch(batch_totals(CAPTURED, "ffn_b64"), batch_totals(after, "ffn_b64")) is None


def test_older_triton_format_without_failure_reasons() -> None:
    """Triton before 2.4x: float values, failures without a reason (no refusals can be told apart)."""
    old = "\n".join(line for line in CAPTURED.splitlines() if "reason=" not in line or 'reason="OTHER"' in line)
    old = old.replace(',reason="OTHER"', "")
    before = (
        "\n".join(
            f"{line.rsplit(' ', 1)[0]} {float(line.rsplit(' ', 1)[1]):f}" if line and not line.startswith("#") else line
            for line in old.splitlines()
        )
        + "\n"
    )
    after = advance(
        before,
        "ffn",
        {
            "nv_inference_request_success": 10,
            "nv_inference_count": 10,
            "nv_inference_exec_count": 10,
            "nv_inference_queue_duration_us": 10 * 1000.0,
            "nv_inference_compute_infer_duration_us": 10 * 3000.0,
            "nv_inference_request_duration_us": 10 * 5000.0,
        },
    )
    figures = server_step((0.0, before), (1.0, after), "ffn")
    assert "0.000000" in before and figures["queue_s"] == pytest.approx(0.001)
    assert figures["compute_s"] == pytest.approx(0.003) and figures["request_s"] == pytest.approx(0.005)
    assert "rejected_count" not in figures and figures["ok_count"] == 10
    assert average_batch(batch_totals(before, "ffn"), batch_totals(after, "ffn")) == 1.0


def test_a_triton_model_config_labels_the_batcher() -> None:
    config = {
        "name": "ffn",
        "platform": "onnxruntime_onnx",
        "max_batch_size": 64,
        "dynamic_batching": {"max_queue_delay_microseconds": 500},
        "instance_group": [{"count": 2, "kind": "KIND_CPU"}],
    }
    batcher = triton_batcher(config)
    assert batcher.as_dict() == {"max_batch_size": 64, "max_queue_delay_ms": 0.5, "instances": 2}
    assert batcher.max_queue_delay_ms == 0.5 and not batcher.says("max_queue_size")  # Triton's queue: not latlab's
    no_dynamic = {**config, "dynamic_batching": None}
    assert triton_batcher(no_dynamic).max_batch_size == 1  # without a dynamic batcher every request runs alone
    assert triton_batcher({"name": "ffn", "detail": "x"}) is None


def test_standard_routes_only_describe_the_model_from_its_metadata() -> None:
    with stub_server(StubModel(), standard_only=True) as host:
        info = describe(host, "m")
        with pytest.raises(LookupError) as missing:
            describe(host, "absent")
        source = metrics_source(host)
    assert info["name"] == "m" and info["server"] == {"name": "stub-oip", "version": "0.1"}
    assert info["platform"] == "stub" and info["model"] == "m" and "batcher" not in info and "provider" not in info
    assert info["settings_unknown"] == "GET /v2/models/m/config answered 404"
    # the error names the route that was missing, not a deployment the metadata route knows
    assert "has no model 'absent': GET /v2/models/absent answered 404" in str(missing.value)
    assert source.url is None and source.kind is None and "/metrics answered 404" in source.note
    key, line = extras_notice(host, info, source)
    assert line.startswith(
        f"server at {host}: GET /v2/models/m/config answered 404 (not a latlab server?): "
        "batcher settings unknown; no server figures"
    )
    assert "the report shows the client side only" in line and "\n" not in line


def test_a_latlab_style_stub_still_describes_from_config() -> None:
    with stub_server(StubModel()) as host:
        info = describe(host, "m")
    assert info["batcher"].as_dict() == {"max_batch_size": 1}
    assert info["provider"] == "cpu" and "settings_unknown" not in info


def test_triton_metrics_at_a_given_url_are_found_and_said() -> None:
    with stub_server(StubModel(), standard_only=True, triton_metrics_path="/triton/metrics") as host:
        source = metrics_source(host, f"{host}/triton/metrics")
        info = describe(host, "m")
    assert source == MetricsSource(
        f"{host}/triton/metrics", "triton", f"Triton's nv_inference_* counters at {host}/triton/metrics"
    )
    key, line = extras_notice(host, info, source, given=True)
    assert "batcher settings unknown" in line and "server figures and batch sizes from Triton's" in line
    assert key != extras_notice(host, info, MetricsSource(None, None, "x"))[0]


def test_the_report_says_client_side_only_where_the_server_has_no_figures() -> None:
    step = simulated(
        target=50,
        achieved_rps=50,
        offered_rps=50,
        p99_s=0.002,
        server={"seconds": 1.0, "busy_s": None, "process_cpu_cores": None},
    )
    curve = Curve(
        "m",
        steps=[step],
        server_metrics={"url": None, "kind": None, "note": "GET http://h/metrics answered 404"},
    )
    text, png = pictures.time_section(findings_of("m", [curve], [0.01]))
    assert png is None and "the report shows the client side only" in text
    assert "GET http://h/metrics answered 404" in text and "--server-metrics" in text


def test_a_triton_config_route_is_read_as_triton_s_not_latlab_s() -> None:
    """Triton answers GET .../config with its own model configuration: its batching labels the curve, and the
    run says there is no latlab /config (the record keeps Triton's config as it came)."""
    import json
    import threading

    from werkzeug.serving import make_server
    from werkzeug.wrappers import Request, Response

    config = {
        "name": "m",
        "platform": "onnxruntime_onnx",
        "max_batch_size": 64,
        "dynamic_batching": {"max_queue_delay_microseconds": 1000},
        "instance_group": [{"name": "m", "kind": "KIND_CPU", "count": 1}],
    }
    routes = {
        "/v2": {"name": "triton", "version": "2.59.0", "extensions": ["binary_tensor_data"]},
        "/v2/models/m": {"name": "m", "versions": ["1"], "platform": "onnxruntime_onnx", "inputs": [], "outputs": []},
        "/v2/models/m/config": config,
    }

    def app(environ, start_response):
        body = routes.get(Request(environ).path)
        response = (
            Response(json.dumps(body), content_type="application/json")
            if body is not None
            else Response('{"error":"not found"}', status=400, content_type="application/json")
        )
        return response(environ, start_response)

    server = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    host = f"http://127.0.0.1:{server.server_port}"
    try:
        info = describe(host, "m")
        source = metrics_source(host)
    finally:
        server.shutdown()
        thread.join(timeout=5)
    assert info["batcher"].as_dict() == {"max_batch_size": 64, "max_queue_delay_ms": 1.0, "instances": 1}
    assert info["server_config"] == config and info["server"] == {"name": "triton", "version": "2.59.0"}
    assert "settings_unknown" not in info and info["model"] == "m" and info["platform"] == "onnxruntime_onnx"
    # its instance group says where the model runs: the report counts it as a CPU deployment
    assert info["provider"] == "cpu" and info["provider_from"] == "Triton model config (instance_group kind)"
    assert source.kind is None and "answered 400" in source.note
    _, line = extras_notice(host, info, source)
    assert "no latlab /config: batcher settings from its Triton model config" in line
