"""The fleet a load test records through its proxy: the targets file read (one line for a bad one), each replica's
and the proxy's counters parsed from their Prometheus text, a step's figures between two readings."""

from __future__ import annotations

import json

import pytest

from latlab.common.user_input import UserError
from latlab.common import procs
from latlab.loadtest.fleet import (
    PROXY_JOB,
    FleetTargets,
    Reading,
    fleet_step,
    proxy_counters,
    read_fleet,
    read_targets,
    replica_requests,
)
from latlab.loadtest.plan import SweepPlan

GROUPS = [
    {"targets": ["127.0.0.1:9001"], "labels": {"fleet": "f", "replica": "r0"}},
    {"targets": ["127.0.0.1:9002"], "labels": {"fleet": "f", "replica": "r1"}},
    {"targets": ["127.0.0.1:9003"], "labels": {"fleet": "f", "job": PROXY_JOB, "balance": "random(2)"}},
]
REPLICA_TEXT = """# TYPE latlab_server_requests_total counter
latlab_server_requests_total{deployment="tiny",outcome="ok"} 40.0
latlab_server_requests_total{deployment="tiny",outcome="rejected"} 2.0
latlab_server_requests_total{deployment="other",outcome="ok"} 7.0
"""
PROXY_TEXT = """# TYPE haproxy_frontend_http_requests_total counter
haproxy_frontend_http_requests_total{proxy="fleet"} 100
haproxy_frontend_http_requests_total{proxy="stats"} 9
# TYPE haproxy_frontend_http_responses_total counter
haproxy_frontend_http_responses_total{proxy="fleet",code="2xx"} 95
haproxy_frontend_http_responses_total{proxy="fleet",code="4xx"} 3
haproxy_frontend_http_responses_total{proxy="fleet",code="5xx"} 2
haproxy_frontend_http_responses_total{proxy="stats",code="5xx"} 50
# TYPE haproxy_backend_retry_warnings_total counter
haproxy_backend_retry_warnings_total{proxy="replicas"} 1
# TYPE haproxy_backend_redispatch_warnings_total counter
haproxy_backend_redispatch_warnings_total{proxy="replicas"} 4
# TYPE haproxy_backend_current_queue gauge
haproxy_backend_current_queue{proxy="replicas"} 5
"""


def test_the_targets_file_names_the_replicas_the_proxy_and_the_balance(tmp_path):
    path = tmp_path / "servers-fleet.json"
    path.write_text(json.dumps(GROUPS))
    fleet = read_targets(path)
    assert fleet.replicas == (("r0", "127.0.0.1:9001"), ("r1", "127.0.0.1:9002"))
    assert fleet.proxy == "127.0.0.1:9003"
    assert fleet.as_dict()["balance"] == "random(2)" and fleet.name == "f"


@pytest.mark.parametrize(
    "content, said",
    [
        (None, "no such file"),
        ("{not json", "not a file_sd JSON"),
        ('{"targets": []}', "not a file_sd JSON"),
        (json.dumps(GROUPS[:2]), "0 proxies"),
        (json.dumps(GROUPS[2:]), "0 replicas"),
    ],
)
def test_a_bad_targets_file_is_one_line_when_the_plan_is_built(tmp_path, content, said):
    path = tmp_path / "servers-fleet.json"
    if content is not None:
        path.write_text(content)
    options = ["--host", "http://127.0.0.1:1", "--deployment", "tiny", "--fleet", str(path)]
    with pytest.raises(UserError, match=said) as raised:
        SweepPlan.from_options(options)
    assert "\n" not in str(raised.value) and str(path) in str(raised.value)


def test_the_plan_carries_the_fleet_to_a_child_process(tmp_path):
    path = tmp_path / "servers-fleet.json"
    path.write_text(json.dumps(GROUPS))
    plan = SweepPlan.from_options(["--host", "http://127.0.0.1:1", "--deployment", "tiny", "--fleet", str(path)])
    assert plan.provenance.fleet == str(path)
    assert SweepPlan.from_json(plan.to_json()) == plan


def test_counters_are_read_for_the_deployment_and_the_fleets_frontend_and_backend():
    assert replica_requests(REPLICA_TEXT, "tiny") == 42.0  # every outcome: what the replica was sent
    assert proxy_counters(PROXY_TEXT) == {
        "requests": 100.0,
        "4xx": 3.0,
        "5xx": 2.0,
        "retries": 1.0,
        "redispatches": 4.0,
        "queue": 5.0,
    }


def test_a_step_counts_each_replica_between_readings_and_their_imbalance():
    proxy = {"requests": 10.0, "4xx": 0.0, "5xx": 0.0, "retries": 0.0, "redispatches": 0.0, "queue": 0.0}
    later = {**proxy, "requests": 70.0, "5xx": 1.0, "queue": 2.0}
    before = Reading({"r0": 10.0, "r1": 5.0, "r2": 3.0, "r3": None}, proxy)
    after = Reading({"r0": 40.0, "r1": 25.0, "r2": 1.0, "r3": 9.0}, later)  # r2 restarted, r3 unread at first
    step = fleet_step(before, after)
    assert step["replicas"] == {"r0": 30.0, "r1": 20.0, "r2": None, "r3": None}
    assert step["imbalance"] == pytest.approx(30.0 / 25.0)
    assert step["proxy"] == {
        "requests": 60.0,
        "4xx": 0.0,
        "5xx": 1.0,
        "retries": 0.0,
        "redispatches": 0.0,
        "queue_at_end": 2.0,
    }


def test_a_step_without_requests_or_the_proxys_page_says_so():
    step = fleet_step(Reading({"r0": 3.0}, None), Reading({"r0": 3.0}, {"requests": 1.0}))
    assert step == {"replicas": {"r0": 0.0}, "imbalance": None, "proxy": None}


def test_a_replica_or_proxy_that_cannot_be_read_is_none_not_an_error():
    closed = f"127.0.0.1:{procs.free_port()}"
    fleet = FleetTargets(path="f.json", replicas=(("r0", closed),), proxy=closed)
    assert read_fleet(fleet, "tiny", timeout_s=1.0) == Reading({"r0": None}, None)
