"""The shipped dashboards and provisioning, checked as files: uids, variables, panel ids, targets, paths.

No Grafana runs here (none can be installed on these machines); test_against_prometheus.py evaluates
every target against a real Prometheus instead.
"""

from __future__ import annotations

import functools
import re
import tomllib
from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry

from latlab.loadtest.loadgen_metrics import LoadGenMetrics
from latlab.server.config import parse_config
from latlab.server.metrics import ServerMetrics
from tests.grafana import shipped

EXPECTED = {  # dashboard file: (uid, its variables in order)
    "serving": ("latlab-serving", ["model", "provider", "deployment"]),
    "loadtest": ("latlab-loadtest", ["run", "deployment"]),
    "cpu-vs-gpu": ("latlab-cpu-vs-gpu", ["model", "provider", "deployment"]),
}
MIN_SCHEMA_VERSION = 39  # Grafana 11.0; the files use 41 (Grafana 12), older versions migrate forward
GPU_ONLY = re.compile(r"latlab_gpu_(utilization_ratio|memory_used_bytes|memory_total_bytes)")
RANGE_SELECTOR = re.compile(r"\[([^\]]+)\]")
METRIC_NAME = re.compile(r"\b(?:\w+:)?latlab_\w+(?::\w+)?")
DASHBOARDS = shipped.dashboards()
TARGETS = shipped.targets()


@functools.cache
def exported_series_names() -> frozenset[str]:
    """Series names the server and the load generator really export, read off their own registries."""
    registry = CollectorRegistry()
    ServerMetrics(registry)
    LoadGenMetrics(registry, "run")
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}
    return frozenset(family.name + suffix for family in registry.collect() for suffix in suffixes[family.type])


def recorded_names() -> set[str]:
    return {rule["record"] for rule in shipped.recording_rules()}


def test_the_three_dashboards_ship_with_their_uids():
    assert set(DASHBOARDS) == set(EXPECTED)
    for stem, dashboard in DASHBOARDS.items():
        uid, _ = EXPECTED[stem]
        assert dashboard["uid"] == uid and dashboard["title"].startswith("latlab / ")
        assert dashboard["schemaVersion"] >= MIN_SCHEMA_VERSION
        assert dashboard.get("id") is None, "a provisioned dashboard must not carry a database id"
        assert "latlab" in dashboard["tags"]


@pytest.mark.parametrize("stem", sorted(EXPECTED))
def test_variables_are_label_values_queries_on_the_datasource(stem):
    dashboard = DASHBOARDS[stem]
    variables = shipped.variables(dashboard)
    assert [v["name"] for v in variables] == EXPECTED[stem][1]
    for variable in variables:
        assert variable["type"] == "query" and variable["datasource"] == shipped.DATASOURCE
        assert variable["query"]["query"] == variable["definition"]
        shipped.label_values(variable["definition"])  # parses as label_values(selector, label)
        if variable["multi"]:
            assert variable["includeAll"] and variable["allValue"] == ".*", variable["name"]
        # A variable may only use the ones defined before it (Grafana resolves them in order).
        earlier = {v["name"] for v in variables[: variables.index(variable)]}
        assert shipped.referenced_variables(variable["definition"]) <= earlier, variable["name"]


@pytest.mark.parametrize("stem", sorted(EXPECTED))
def test_every_variable_is_used_and_every_reference_is_defined(stem):
    dashboard = DASHBOARDS[stem]
    defined = {v["name"] for v in shipped.variables(dashboard)}
    used: set[str] = set()
    for panel in shipped.panels(dashboard):
        used |= shipped.referenced_variables(panel.get("title", ""))
        for target in panel.get("targets", []):
            used |= shipped.referenced_variables(target["expr"])
        if panel.get("repeat"):
            assert panel["repeat"] in defined
    assert used - shipped.BUILTINS <= defined, f"undefined: {used - shipped.BUILTINS - defined}"
    assert defined <= used, f"unused variables: {defined - used}"


@pytest.mark.parametrize("stem", sorted(EXPECTED))
def test_panel_ids_are_unique_and_panels_fit_the_grid(stem):
    panels = list(shipped.panels(DASHBOARDS[stem]))
    ids = [panel["id"] for panel in panels]
    assert len(ids) == len(set(ids)), f"duplicate panel ids: {sorted(i for i in ids if ids.count(i) > 1)}"
    taken: dict[tuple[int, int], int] = {}
    for panel in panels:
        pos = panel["gridPos"]
        assert pos["w"] > 0 and pos["h"] > 0 and 0 <= pos["x"] and pos["x"] + pos["w"] <= 24, panel["title"]
        for x in range(pos["x"], pos["x"] + pos["w"]):
            for y in range(pos["y"], pos["y"] + pos["h"]):
                assert (x, y) not in taken, f"{panel['title']!r} overlaps panel {taken[(x, y)]}"
                taken[(x, y)] = panel["id"]


@pytest.mark.parametrize("stem", sorted(EXPECTED))
def test_every_panel_queries_the_provisioned_datasource(stem):
    for panel in shipped.panels(DASHBOARDS[stem]):
        if panel["type"] == "row":
            assert not panel.get("targets")
            continue
        assert panel["datasource"] == shipped.DATASOURCE, panel["title"]
        assert panel["targets"], f"{panel['title']!r} has no query"
        refs = [target["refId"] for target in panel["targets"]]
        assert len(refs) == len(set(refs)), panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == shipped.DATASOURCE, (panel["title"], target["refId"])
            assert target["expr"].strip(), (panel["title"], target["refId"])
        if panel["type"] == "heatmap":
            assert all(t.get("format") == "heatmap" and t["legendFormat"] == "{{le}}" for t in panel["targets"])
            assert panel["options"]["calculate"] is False  # Prometheus buckets, not Grafana's own
        if panel["type"] == "table":
            assert all(t["instant"] and t.get("format") == "table" for t in panel["targets"])


@pytest.mark.parametrize("target", TARGETS, ids=lambda t: t.name)
def test_targets_use_grafana_windows_and_real_metric_names(target):
    """Rate windows follow the scrape interval ($__rate_interval) or the time range ($__range); every
    latlab_* name is one the server or the load generator exports, or a recording rule records."""
    for window in RANGE_SELECTOR.findall(target.expr):
        assert window in ("$__rate_interval", "$__range"), f"fixed window [{window}] in {target.expr!r}"
    known = exported_series_names() | recorded_names()
    for name in METRIC_NAME.findall(target.expr):
        assert name in known, f"{target.name}: {name} is neither exported nor recorded"


def test_gpu_panels_also_show_how_many_gpus_the_server_sees():
    """Without a GPU the GPU-only series are absent; the device count (0) says why the panel is empty."""
    for stem, dashboard in DASHBOARDS.items():
        for panel in shipped.panels(dashboard):
            exprs = [t["expr"] for t in panel.get("targets", [])]
            if any(GPU_ONLY.search(e) for e in exprs):
                assert any(e.strip() == "latlab_gpu_devices" for e in exprs), (stem, panel["title"])


def test_recording_rules_and_alerts_use_real_metric_names():
    known = exported_series_names() | recorded_names()
    rules = shipped.recording_rules() + shipped.alert_rules()
    for rule in rules:
        for name in METRIC_NAME.findall(rule["expr"]):
            assert name in known, f"{rule.get('record') or rule['alert']}: {name} is neither exported nor recorded"
    for rule in shipped.alert_rules():
        shipped.alert_signal(rule["expr"])  # `signal > bound`, so the signal can be tested on its own
        assert rule["for"] and rule["labels"]["severity"] and rule["annotations"]["summary"]


def test_provisioning_points_at_the_shipped_datasource_and_dashboards():
    datasources = yaml.safe_load((shipped.GRAFANA / "provisioning/datasources/prometheus.yml").read_text())
    (datasource,) = datasources["datasources"]
    assert datasource["uid"] == shipped.DATASOURCE["uid"] and datasource["type"] == "prometheus"
    assert datasource["url"] == "http://127.0.0.1:9090"
    prometheus = yaml.safe_load((shipped.GRAFANA / "prometheus.yml").read_text())
    assert datasource["jsonData"]["timeInterval"] == prometheus["global"]["scrape_interval"]
    providers = yaml.safe_load((shipped.GRAFANA / "provisioning/dashboards/latlab.yml").read_text())
    (provider,) = providers["providers"]
    assert provider["type"] == "file"
    # docker-compose.yml mounts grafana/dashboards exactly where the provider looks.
    mounts = compose_mounts("grafana")
    assert mounts[provider["options"]["path"]] == shipped.DASHBOARD_DIR
    assert mounts["/etc/grafana/provisioning"] == shipped.GRAFANA / "provisioning"


def compose() -> dict:
    return yaml.safe_load((shipped.ROOT / "docker-compose.yml").read_text())


def compose_mounts(service: str) -> dict[str, Path]:
    """{container path: repository path} of a service's bind mounts (named volumes left out)."""
    mounts = {}
    for volume in compose()["services"][service].get("volumes", []):
        source, target = volume.split(":")[:2]
        if source.startswith("."):
            mounts[target] = (shipped.ROOT / source).resolve()
    return mounts


def test_compose_runs_prometheus_grafana_and_the_server_on_the_shipped_files():
    services = compose()["services"]
    assert {"prometheus", "grafana", "lab"} <= set(services)
    for name, service in services.items():
        assert ":" in service["image"] and not service["image"].endswith(":latest"), f"{name}: pin the image"
        for repo_path in compose_mounts(name).values():
            assert repo_path.exists(), f"{name} mounts {repo_path}, which is not in the repository"
    # Prometheus reads grafana/prometheus.yml from where the mount puts it.
    mounts = compose_mounts("prometheus")
    (config_flag,) = [a for a in services["prometheus"]["command"] if a.startswith("--config.file=")]
    config = Path(config_flag.split("=", 1)[1])
    seen_as = [
        repo / config.relative_to(container) for container, repo in mounts.items() if config.is_relative_to(container)
    ]
    assert seen_as == [shipped.GRAFANA / "prometheus.yml"]
    # Grafana and the server share Prometheus' network namespace, so 127.0.0.1 targets hold in Docker too.
    assert services["grafana"]["network_mode"] == services["lab"]["network_mode"] == "service:prometheus"


def test_compose_server_config_is_a_valid_latlab_config():
    lab = compose()["services"]["lab"]
    command = lab["command"] if isinstance(lab["command"], str) else " ".join(lab["command"])
    serve = re.search(r"latlab serve --config (\S+)", command)
    assert serve and "--host 0.0.0.0" in command
    # The service serves a copy of the checkout in its working_dir.
    config = shipped.ROOT / Path(serve[1]).relative_to(lab["working_dir"])
    assert config.is_file(), f"the compose server's config {config} is not shipped"
    parsed = parse_config(tomllib.loads(config.read_text()))
    assert all(d.provider == "cpu" for d in parsed.deployments)
