"""The fleet's one typed value and what is written from it: HAProxy's config (checked by haproxy itself), the
Prometheus targets and each replica's server config."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from latlab.common.user_input import UserError
from latlab.fleet.haproxy import check_config, haproxy_config
from latlab.fleet.spec import BALANCES, READY_PATH, FleetSpec, Replica, plan_replicas
from latlab.fleet.spec import read_config_document, replica_document
from latlab.fleet.targets import PROXY_JOB, file_sd, write_targets
from latlab.loadtest.fleet import read_targets
from latlab.server.config import load_config, save_config


def spec(tmp_path: Path, **options: object) -> FleetSpec:
    replicas = plan_replicas(2, [9100, 9101, 9102, 9103], cores=4)
    return FleetSpec(replicas, port=9000, stats_port=9001, admin_socket=tmp_path / "admin.sock", **options)


@pytest.mark.parametrize("balance", BALANCES)
@pytest.mark.parametrize("rate_limit", [0, 50])
def test_haproxy_accepts_every_config_the_writer_makes(tmp_path, balance, rate_limit):
    path = tmp_path / "haproxy.cfg"
    path.write_text(haproxy_config(spec(tmp_path, balance=balance, rate_limit=rate_limit)))
    check_config(path)  # raises with haproxy's words on a refusal


def test_haproxy_refusal_is_reported_in_its_words(tmp_path):
    path = tmp_path / "haproxy.cfg"
    path.write_text(haproxy_config(spec(tmp_path)).replace("balance leastconn", "balance nonsense"))
    with pytest.raises(UserError, match="balance only supports"):
        check_config(path)


def test_config_balances_checks_readiness_on_the_observer_port_and_exports_metrics(tmp_path):
    text = haproxy_config(spec(tmp_path, balance="random(2)"))
    assert "balance random(2)" in text
    assert f"http-check send meth GET uri {READY_PATH}" in text
    assert "server r0 127.0.0.1:9100 port 9101" in text and "server r1 127.0.0.1:9102 port 9103" in text
    assert "bind 127.0.0.1:9000" in text and "bind 127.0.0.1:9001" in text
    assert "http-request use-service prometheus-exporter if { path /metrics }" in text
    assert "http-reuse" in text
    assert f"stats socket {tmp_path / 'admin.sock'} mode 600 level admin" in text
    assert "retry-on conn-failure" in text  # never a retry of a request the replica may have started
    outside_paths = text.replace(str(tmp_path), "")  # pytest's own folder names can hold "429"
    assert "stick-table" not in outside_paths and "429" not in outside_paths


def test_rate_limit_tracks_each_client_ip_and_answers_429_with_retry_after(tmp_path):
    text = haproxy_config(spec(tmp_path, rate_limit=7))
    assert "stick-table type ip" in text and "http-request track-sc0 src" in text
    assert "status 429" in text and "hdr Retry-After 1" in text and "sc_http_req_rate(0) gt 7" in text


@pytest.mark.parametrize(
    "options, message",
    [({"balance": "source"}, "--balance"), ({"rate_limit": -1}, "--rate-limit")],
)
def test_spec_refuses_what_the_proxy_cannot_do(tmp_path, options, message):
    with pytest.raises(UserError, match=message):
        spec(tmp_path, **options)


def test_replicas_share_the_cores_and_take_gpus_round_robin():
    replicas = plan_replicas(3, list(range(9100, 9106)), cores=16, gpus=2)
    assert [r.cpu_threads for r in replicas] == [5, 5, 5]
    assert [r.device for r in replicas] == ["cuda:0", "cuda:1", "cuda:0"]
    assert [(r.port, r.metrics_port) for r in replicas] == [(9100, 9101), (9102, 9103), (9104, 9105)]
    assert [r.cpu_threads for r in plan_replicas(4, list(range(8)), cores=2)] == [1, 1, 1, 1]
    assert {r.device for r in plan_replicas(2, list(range(4)), cores=2)} == {"cpu"}


def test_targets_list_every_replica_observer_port_and_the_proxy_exporter(tmp_path):
    fleet = spec(tmp_path)
    groups = json.loads(write_targets(fleet, tmp_path / "targets" / "servers-fleet.json").read_text())
    assert groups == file_sd(fleet)
    assert [g["targets"] for g in groups] == [["127.0.0.1:9101"], ["127.0.0.1:9103"], ["127.0.0.1:9001"]]
    assert [g["labels"].get("replica") for g in groups[:2]] == ["r0", "r1"]
    assert groups[2]["labels"]["job"] == PROXY_JOB
    assert all(set(g) == {"targets", "labels"} for g in groups)
    # where each replica serves infer requests, for a load test's measure of the proxy's added latency
    assert read_targets(tmp_path / "targets" / "servers-fleet.json").serving == (
        ("r0", "127.0.0.1:9100"),
        ("r1", "127.0.0.1:9102"),
    )


def test_replica_config_serves_the_fleet_config_on_its_ports_threads_and_gpu(tmp_path, tiny_model):
    folder = tmp_path / "conf"
    folder.mkdir()
    relative = Path("..") / tiny_model.relative_to(tmp_path)
    config = save_config(
        {
            "server": {"port": 8000},
            "deployments": [
                {"name": "a", "model_path": relative},
                {"name": "b", "model_path": relative, "cpu": {"intra_op_threads": 3}},
                {"name": "c", "model_path": relative, "provider": "cuda"},
            ],
        },
        folder / "server.toml",
    )
    replica = Replica("r1", port=9102, metrics_port=9103, device="cuda:1", cpu_threads=2)
    written = save_config(replica_document(read_config_document(config), replica, gpus=2), tmp_path / "r1.toml")
    served = load_config(written)
    assert (served.host, served.port, served.metrics_port) == ("127.0.0.1", 9102, 9103)
    a, b, c = served.deployments
    assert a.model_path == tiny_model.resolve()
    assert (a.cpu.intra_op_threads, b.cpu.intra_op_threads) == (2, 3)  # a config's own setting wins
    assert c.cuda.device_id == 1
