"""deploy/: the core Kubernetes kinds validate offline (kubernetes-validate's bundled schemas, strict), and every
port, path, metric, name and option the manifests use exists: the servers their configs describe are started for
real (on the tiny model, on free ports) and asked. KServe's kinds have no bundled schema: they are checked only
against the server and each other."""

from __future__ import annotations

import shlex
import tomllib
from pathlib import Path
from typing import Iterator

import kubernetes_validate
import pytest
import requests
import yaml

from latlab.cli import _parser
from latlab.common import procs
from latlab.server.command import serve_command
from latlab.server.config import save_config

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
KUBERNETES_VERSION = "1.30"
CORE = {"v1", "apps/v1", "batch/v1", "autoscaling/v2"}
NOT_VALIDATED = {("serving.kserve.io/v1alpha1", "ServingRuntime"), ("serving.kserve.io/v1beta1", "InferenceService")}


def documents() -> list[dict]:
    return [doc for path in sorted(DEPLOY.rglob("*.yaml")) for doc in yaml.safe_load_all(path.read_text()) if doc]


def named(kind: str, name: str | None = None) -> dict:
    found = [d for d in documents() if d["kind"] == kind and name in (None, d["metadata"]["name"])]
    assert len(found) == 1, f"{len(found)} {kind} {name or ''} in deploy/"
    return found[0]


def test_every_core_kind_is_valid_and_only_kserve_kinds_go_unvalidated():
    unvalidated = set()
    for doc in documents():
        if doc["apiVersion"] in CORE:
            kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)  # raises naming the field
        else:
            unvalidated.add((doc["apiVersion"], doc["kind"]))
    assert unvalidated == NOT_VALIDATED


def server_toml(configmap: str) -> dict:
    return tomllib.loads(named("ConfigMap", configmap)["data"]["server.toml"])


def container_of(pod_spec: dict) -> dict:
    (container,) = pod_spec["containers"]
    return container


@pytest.fixture
def real_server(tmp_path: Path, tiny_model: Path) -> Iterator:
    """real_server(configmap) -> {port the manifests name: the port the real server has} for a server serving the
    ConfigMap's config, with the tiny model and free ports in place of the cluster's."""
    started = []

    def start(configmap: str) -> dict[int, int]:
        doc = server_toml(configmap)
        ports = {doc["server"]["port"]: procs.free_port(), doc["server"]["metrics_port"]: procs.free_port()}
        doc["server"] |= {"host": "127.0.0.1", "port": ports[doc["server"]["port"]]}
        doc["server"]["metrics_port"] = ports[doc["server"]["metrics_port"]]
        for deployment in doc["deployments"]:
            deployment["model_path"] = tiny_model
        config = save_config(doc, tmp_path / f"{configmap}.toml")
        log = tmp_path / f"{configmap}.log"
        server = procs.start(serve_command(config), log_path=log)
        started.append(server)
        procs.wait_ready(f"http://127.0.0.1:{doc['server']['port']}/v2/health/ready", server, log_path=log)
        return ports

    try:
        yield start
    finally:
        for server in started:
            procs.stop(server)


def probe_port(container: dict, port: int | str) -> int:
    if isinstance(port, int):
        return port
    return next(p["containerPort"] for p in container["ports"] if p.get("name") == port)


def check_container(container: dict, pod_spec: dict, configmap: str, ports: dict[int, int]) -> None:
    """The container serves the ConfigMap's config on its ports, and its probes answer 200 on the real server."""
    command = container["command"]
    assert command[:3] == ["latlab", "serve", "--config"]
    mount = next(m for m in container["volumeMounts"] if command[3] == f"{m['mountPath']}/server.toml")
    volume = next(v for v in pod_spec["volumes"] if v["name"] == mount["name"])
    assert volume["configMap"]["name"] == configmap
    http = server_toml(configmap)["server"]["port"]
    assert http in [p["containerPort"] for p in container["ports"]]
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        if probe in container:
            get = container[probe]["httpGet"]
            port = probe_port(container, get["port"])
            assert port in ports, f"{probe} on port {port}, which the server does not open"
            answer = requests.get(f"http://127.0.0.1:{ports[port]}{get['path']}", timeout=10)
            assert answer.status_code == 200, f"{probe} {get['path']}: {answer.status_code}"


def test_the_deployment_probes_service_and_autoscaler_name_what_the_server_has(real_server):
    ports = real_server("latlab-config")
    deployment = named("Deployment", "latlab")
    pod_spec = deployment["spec"]["template"]["spec"]
    container = container_of(pod_spec)
    check_container(container, pod_spec, "latlab-config", ports)
    names = {p["name"] for p in container["ports"]}
    service = named("Service", "latlab")
    assert service["spec"]["selector"] == deployment["spec"]["template"]["metadata"]["labels"]
    assert {p["targetPort"] for p in service["spec"]["ports"]} <= names

    hpa = named("HorizontalPodAutoscaler", "latlab")
    assert hpa["spec"]["scaleTargetRef"]["name"] == "latlab"
    (metric,) = [m["pods"]["metric"]["name"] for m in hpa["spec"]["metrics"]]
    exposed = requests.get(f"http://127.0.0.1:{ports[8001]}/metrics", timeout=10).text
    assert f"\n{metric}{{" in exposed, f"the server exposes no {metric}"
    adapter = yaml.safe_load(named("ConfigMap", "latlab-adapter-config")["data"]["config.yaml"])
    assert [rule["seriesQuery"].split("{")[0].strip("'") for rule in adapter["rules"]] == [metric]


def test_the_kserve_runtime_serves_the_inference_service_model_on_kserve_port(real_server):
    ports = real_server("latlab-kserve-config")
    runtime = named("ServingRuntime", "latlab")
    check_container(container_of(runtime["spec"]), runtime["spec"], "latlab-kserve-config", ports)
    assert container_of(runtime["spec"])["ports"][0]["containerPort"] == 8080  # where KServe sends requests
    service = named("InferenceService")
    predictor = service["spec"]["predictor"]["model"]
    assert predictor["runtime"] == "latlab" and predictor["protocolVersion"] in runtime["spec"]["protocolVersions"]
    assert predictor["modelFormat"]["name"] in [f["name"] for f in runtime["spec"]["supportedModelFormats"]]
    # v2 routes name the model: the InferenceService's name must be a deployment of the runtime's config
    name = service["metadata"]["name"]
    assert name in [d["name"] for d in server_toml("latlab-kserve-config")["deployments"]]
    model = requests.get(f"http://127.0.0.1:{ports[8080]}/v2/models/{name}/ready", timeout=10)
    assert model.status_code == 200


def test_the_load_jobs_reach_the_server_and_each_other_with_options_latlab_accepts():
    master = container_of(named("Job", "latlab-loadgen-master")["spec"]["template"]["spec"])
    args = _parser().parse_args(master["command"][1:])  # latlab's own parser: an unknown option fails here
    assert args.host == "http://latlab:8000"
    assert 8000 in [p["port"] for p in named("Service", "latlab")["spec"]["ports"]]
    assert set(args.deployment) <= {d["name"] for d in server_toml("latlab-config")["deployments"]}
    loadgen = named("Service", "latlab-loadgen")
    assert loadgen["spec"]["selector"].items() <= (
        named("Job", "latlab-loadgen-master")["spec"]["template"]["metadata"]["labels"].items()
    )
    assert args.master_port in [p["port"] for p in loadgen["spec"]["ports"]]
    worker = container_of(named("Job", "latlab-loadgen-workers")["spec"]["template"]["spec"])
    words = shlex.split(worker["command"][-1])
    assert "--worker" in words and "--master-host=latlab-loadgen" in words
    assert f"--master-port={args.master_port}" in words
    assert named("Job", "latlab-loadgen-workers")["spec"]["parallelism"] == args.expect_workers
