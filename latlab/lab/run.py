"""`latlab lab`: a built-in plan end to end: export, bench, search (a step the caller gives), serve, sweep, report;
stops all it started."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from latlab.bench.plan import BenchOptions, run_child
from latlab.common import procs
from latlab.common.settings import CpuOptions
from latlab.lab.children import model_workload, start_serving, step_schedule, write_samples
from latlab.lab.plan import MANY_CORES, PLANS, CpuShare, LabPlan, ModelPlan, available_cores, cpu_share
from latlab.loadtest import child
from latlab.loadtest.arrivals import Arrivals
from latlab.loadtest.plan import Provenance, SweepPlan, Workers
from latlab.loadtest.results import new_run_id
from latlab.loadtest.schedule import SloSearch
from latlab.server.config import dumps_config, save_config
from latlab.server.http.native import library

if TYPE_CHECKING:  # the report's types, not its imports: the lab loads the report when it writes it
    from latlab.report.fleetplan.plan import PlanRequest

GRAFANA_DIR = Path(__file__).resolve().parents[2] / "grafana"

SearchStep = Callable[[Path, Path, LabPlan, dict[str, Path], CpuShare, Callable[[str], None]], LabPlan]
"""The lab's search step (latlab/tune/lab_search.py, `search_plan`): the run folder, the models folder, the plan, its
model files, the CPU share and where to say progress; returns the plan with each best as a tuned deployment."""


def _say(message: str) -> None:
    print(f"[lab {time.strftime('%H:%M:%S')}] {message}", flush=True)


def ensure_models(models_dir: Path, plan: LabPlan) -> dict[str, Path]:
    """Export the plan's zoo models unless an export with the same settings is already there; the user's own
    models (ModelPlan.onnx) are served from their file as they are."""
    from latlab.export.onnx_export import export, load_metadata
    from latlab.export.zoo import BUILDERS

    paths = {}
    for model in plan.models:
        if model.onnx is not None:
            paths[model.name] = model.onnx.resolve()
            _say(f"model {model.name}: your model, served as it is from {paths[model.name]}")
            continue
        path = models_dir / model.name / "model.onnx"
        try:
            current = load_metadata(models_dir / model.name).get("config", {})
        except FileNotFoundError:
            current = None
        zoo = BUILDERS[model.name](**model.settings)
        if current == zoo.config and path.is_file():
            _say(f"model {model.name} up to date: {path}")
        else:
            started = time.perf_counter()
            meta = export(model.name, zoo, models_dir, source=f"latlab zoo: {model.name}({zoo.config})")
            _say(
                f"exported {model.name} ({meta['params']:,} params, parity rel error "
                f"{meta['parity']['max_rel_error']:.1e}) in {time.perf_counter() - started:.1f} s"
            )
        paths[model.name] = path.resolve()
    return paths


def write_config(
    run_dir: Path, models: dict[str, Path], port: int, plan: LabPlan, share: CpuShare | None = None
) -> Path:
    """The lab's server config, run_dir/lab.toml (see config_document)."""
    return save_config(config_document(models, port, plan, share), run_dir / "lab.toml")


def config_text(models: dict[str, Path], port: int, plan: LabPlan, share: CpuShare | None = None) -> str:
    """The lab's server config as TOML (see config_document)."""
    return dumps_config(config_document(models, port, plan, share))


def config_document(models: dict[str, Path], port: int, plan: LabPlan, share: CpuShare | None = None) -> dict:
    """The lab's server config, as latlab.server.config writes it: every model on every provider of the plan,
    batching off and on; CPU deployments on the share's threads (by default this machine's fair share, see
    cpu_share)."""
    share = share or cpu_share(available_cores())
    cpu = CpuOptions.partial(**{"intra_op_threads": share.cpu_threads, **plan.cpu.as_dict()}).as_dict()
    deployments = []
    for model in plan.models:
        for name, provider, batcher in plan.deployments(model):
            text = plan.is_text(model, name)
            deployments.append(
                {
                    "name": name,
                    "model": model.name,
                    "model_path": models[model.name],
                    "provider": provider,
                    "cpu": cpu if provider == "cpu" else None,
                    "batcher": batcher,
                    "tokenizer": tokenizer_table(models[model.name]) if text else None,
                }
            )
        deployments += list(model.tuned)
    server = {"host": "127.0.0.1", "port": port}
    frontends = frontends_for(plan, share)
    if frontends > 1:
        server["frontends"] = frontends
        server["interface"] = frontend_interface()[0]
    return {"server": server, "deployments": deployments}


def frontend_interface() -> tuple[str, str]:
    """The interface of the lab's front ends, where it runs several: native (no thread per request: about a third
    of a WSGI front end's CPU a request, docs/performance.md "Native front ends") where its native part builds on
    this machine, else WSGI and why."""
    lib, why = library()
    return ("native", "") if lib is not None else ("wsgi", why)


MAX_LAB_FRONTENDS = 8


def frontends_for(plan: LabPlan, share: CpuShare) -> int:
    """Front-end processes of the lab's server ([server] frontends): one on a CPU plan or a small machine (on 2
    cores a second process only adds the hop's CPU: docs/performance.md); on a GPU plan with MANY_CORES or more,
    every core the load generator's workers and the engine leave, up to MAX_LAB_FRONTENDS, so that the front end
    is not what caps a CUDA deployment (one process held a batched CUDA deployment to a small share of an H100:
    docs/gpu-findings.md). The deployments are measured one at a time, so the front ends do not take cores from a CPU
    deployment's ORT threads while they compute. A fleet's replicas split those cores between them."""
    if plan.providers == ("cpu",) or share.cores < MANY_CORES:
        return 1
    return max(1, min(MAX_LAB_FRONTENDS, (share.cores - max(1, share.load_workers) - 1) // share.replicas))


def tokenizer_table(model_path: Path) -> dict:
    """A text deployment's [deployments.tokenizer], as the model's export describes it (text_deployment)."""
    meta = json.loads((model_path.parent / "metadata.json").read_text())
    # exports from before text deployments carry only the tokenizer's folder and sentence-transformers' limit
    text = meta.get("text_deployment", {}).get("tokenizer") or {
        "file": f"{meta['tokenizer']['folder']}/tokenizer.json",
        "max_length": meta["tokenizer"]["max_seq_length"],
    }
    return {"file": model_path.parent / text["file"], "max_length": text["max_length"]}


def start_prometheus(run_dir: Path, jobs: dict[str, list[str]]) -> subprocess.Popen | None:
    """A real Prometheus scraping the server and the load generator every second, storing into the run
    folder; without Debian's `prometheus` the lab goes on and says so."""
    from latlab.common import prometheus

    if prometheus.find_binary() is None:
        _say(prometheus.NOT_FOUND)
        return None
    # 9090 is where grafana/provisioning's datasource looks; another free port if it is taken.
    port = 9090 if procs.port_free(9090) else procs.free_port()
    rules = sorted((GRAFANA_DIR / "rules").glob("*.yml"))
    config = prometheus.write_config(run_dir / "prometheus.yml", jobs, interval_s=1.0, rule_files=rules)
    process = prometheus.start(config, run_dir / "prometheus", port, run_dir / "prometheus.log")
    url = prometheus.base_url(port)
    prometheus.wait_ready(url, process, log_path=run_dir / "prometheus.log")
    _say(
        f"Prometheus on {url} (data: {run_dir / 'prometheus'}); e.g. "
        f"{url}/graph?g0.expr=latlab_loadtest_step_p99_seconds"
    )
    grafana = "http://127.0.0.1:3000"
    if not procs.port_free(3000):
        _say(
            f"Grafana seems to run on {grafana}: dashboards Serving, Load test, CPU vs GPU "
            f"(datasource {'ok' if port == 9090 else f'expects :9090, set it to {url}'})"
        )
    else:
        _say("Grafana: not running; see grafana/README.md to start it with the shipped dashboards")
    (run_dir / "prometheus.url").write_text(url + "\n")
    return process


def run_lab(
    runs_dir: Path,
    models_dir: Path,
    plan: LabPlan | str = "cpu",
    share: CpuShare | None = None,
    machine_name: str | None = None,
    prices: dict | None = None,
    search: SearchStep | None = None,
    fleet_plan: PlanRequest | None = None,
) -> Path:
    """Run the whole plan; returns the report's path. Every child is stopped, also on Ctrl-C.
    `machine_name` names this machine in results and reports (default: its CPU model, or GPU); `prices` are
    the report's (`latlab report --price`; default: the example prices); `search` is the search step a plan
    with search minutes runs (the CLI gives latlab.tune.lab_search.search_plan); `fleet_plan` asks the report for
    the fleet plan's section (`latlab report --plan-traffic`)."""
    from latlab.report.write import write_report

    plan = PLANS[plan] if isinstance(plan, str) else plan
    if plan.search_minutes > 0 and search is None:
        raise ValueError(f"the plan searches for {plan.search_minutes:g} min: give run_lab its search step")
    share = share or cpu_share(available_cores(), replicas=plan.replicas)
    if share.replicas != plan.replicas:
        raise ValueError(f"the CPU share is split {share.replicas} ways for a plan of {plan.replicas} replicas")
    started = time.perf_counter()
    run_dir = runs_dir / new_run_id()
    run_dir.mkdir(parents=True, exist_ok=True)
    _say(f"run folder {run_dir}")
    write_samples(run_dir, plan)
    _say(share.describe())
    if frontends_for(plan, share) > 1:
        interface, why = frontend_interface()
        kind = "native" if interface == "native" else f"WSGI (the native interface could not be built: {why})"
        _say(f"the server runs {frontends_for(plan, share)} {kind} front-end processes feeding one engine process")
    steps = 6 if plan.search_minutes > 0 else 5
    _say(f"step 1/{steps}: exporting models")
    models = ensure_models(models_dir, plan)
    if plan.bench:
        _say(f"step 2/{steps}: in-process batch-time curves (latlab bench --quick; feeds the report's prediction)")
        run_bench(run_dir, models_dir, plan, share.cpu_threads)
    else:
        _say(f"step 2/{steps}: bench skipped by the plan")
    if search is not None and plan.search_minutes > 0:
        _say(f"step 3/{steps}: searching configurations and variants ({plan.search_minutes:g} min for all models)")
        plan = search(run_dir, models_dir, plan, models, share, _say)
    port = procs.free_port()
    config = write_config(run_dir, models, port, plan, share)
    _say(f"step {steps - 2}/{steps}: {serving_line(plan, port, run_dir)}")
    serving = start_serving(config, port, run_dir, plan, share, _say)
    _say(f"ready {serving.cold_start_s:.1f} s after its start (the run's cold start, which `latlab plan` uses)")
    prometheus_process = None
    metrics_port = procs.free_port()
    try:
        prometheus_process = start_prometheus(
            run_dir, {**serving.scrape, "latlab-loadgen": [f"127.0.0.1:{metrics_port}"]}
        )
        _say(f"step {steps - 1}/{steps}: sweeping offered load per deployment (Locust, open loop)")
        for model in plan.models:
            sweep_model(
                run_dir,
                plan,
                model,
                serving.host,
                metrics_port,
                share.load_workers,
                machine_name,
                serving.fleet_targets,
                serving.cold_start_s,
            )
    finally:
        serving.stop()
        if prometheus_process is not None:
            procs.stop(prometheus_process)
    _say(f"step {steps}/{steps}: writing the report")
    report = write_report(run_dir, list(plan.slos.seconds), prices=prices, plan=fleet_plan)
    _say(f"done in {time.perf_counter() - started:.0f} s")
    print(f"report: {report.resolve()}")
    return report


def serving_line(plan: LabPlan, port: int, run_dir: Path) -> str:
    """What the lab says as it starts serving: one server and its log, or a fleet and its folder."""
    host = f"http://127.0.0.1:{port}"
    if plan.replicas == 1:
        return f"starting the server on {host} (log: {run_dir / 'server.log'})"
    return (
        f"starting a fleet of {plan.replicas} replicas behind HAProxy on {host}, balance {plan.balance} "
        f"(configs and logs: {run_dir / 'fleet'})"
    )


def run_bench(run_dir: Path, models_dir: Path, plan: LabPlan, cpu_threads: int) -> None:
    """The quick bench of the plan's models, into run_dir/bench/ where the report finds it; with the
    servers' ORT thread count and sequence length, so its batch times predict the served deployments."""
    options = BenchOptions(
        quick=True,
        models=",".join(m.name for m in plan.models),
        backends=",".join(["ort-cpu", "torch-cpu"] + (["ort-cuda"] if "cuda" in plan.providers else [])),
        threads=cpu_threads,
        seq_len=max(m.seq_len for m in plan.models),
        cache_dir=models_dir / "bench",
    )
    run_child(options, run_dir / "bench")


def sweep_model(
    run_dir: Path,
    plan: LabPlan,
    model: ModelPlan,
    host: str,
    metrics_port: int,
    load_workers: int = 0,
    machine_name: str | None = None,
    fleet: Path | None = None,
    cold_start_s: float | None = None,
) -> None:
    """One Locust sweep over the model's deployments per traffic profile of the plan, with the model's loads and
    request encoding, into run_dir/<model> (the first profile) and run_dir/<model>/traffic-<k> (a load test of its
    own each: see sweep_plan); `fleet`: the targets of the fleet behind `host`; `cold_start_s`: its start to
    ready, recorded in each run."""
    for k, arrivals in enumerate(plan.traffic):
        if len(plan.traffic) > 1:
            _say(f"{model.name}: traffic {k + 1} of {len(plan.traffic)}, {arrivals.spec} arrivals")
        sweep = sweep_plan(
            run_dir, plan, model, host, metrics_port, load_workers, machine_name, arrivals, fleet, cold_start_s
        )
        child.run(sweep, traffic_folder(run_dir, model, k), run_id=run_dir.name)


CEILING_HEADROOM = 1.25
"""How far past the device's in-process ceiling the sweep may raise the rate: a served rate cannot pass it, so a
step there shows saturation."""


def device_ceiling(run_dir: Path, plan: LabPlan, model: ModelPlan) -> float:
    """The rate the run's bench says CUDA computes the model at on full batches of its batching setting
    (report.predict.capacity_rps of the ort-cuda batch-time fit); 0 without CUDA in the plan or a bench. A GPU's
    capacity lies far past what a plan's listed rates guess, and its verdict needs the sweep to reach it: a sweep
    that stops short leaves the GPU's cost an upper bound and the answer open. On the CPU the listed rates reach
    saturation already."""
    bench = run_dir / "bench" / "bench.json"
    if "cuda" not in plan.providers or not bench.is_file():
        return 0.0
    from latlab.report.predict import bench_fits, capacity_rps

    batch = model.batching.max_batch_size or 1
    fits = bench_fits([json.loads(bench.read_text())])
    return max(
        (capacity_rps(f["fit"], batch, 1) for f in fits if (f["model"], f["backend"]) == (model.name, "ort-cuda")),
        default=0.0,
    )


def traffic_folder(run_dir: Path, model: ModelPlan, k: int) -> Path:
    """Where a model's sweep under the plan's k-th traffic profile writes its results."""
    return run_dir / model.name if k == 0 else run_dir / model.name / f"traffic-{k}"


def sweep_plan(
    run_dir: Path,
    plan: LabPlan,
    model: ModelPlan,
    host: str,
    metrics_port: int,
    load_workers: int = 0,
    machine_name: str | None = None,
    arrivals: Arrivals = Arrivals(),
    fleet: Path | None = None,
    cold_start_s: float | None = None,
) -> SweepPlan:
    """The load test of one model's sweep; with load_workers, a Locust master with that many local worker
    processes. Past the model's rates it raises the load until each deployment saturates or its p99 passes twice
    the plan's largest SLO (beyond that no SLO of the report can change), then brackets every SLO of the plan.
    With `fleet` (a fleet's targets file, `host` its proxy), every step also records the fleet; `cold_start_s`
    (the server's start to ready) is recorded in the run."""
    return SweepPlan(
        workload=model_workload(model, run_dir, host, plan.deployment_names(model), plan.sizes),
        schedule=step_schedule(
            plan,
            model.rates,
            max_rate=max(
                max(model.rates) * max(1.0, plan.raise_cap), CEILING_HEADROOM * device_ceiling(run_dir, plan, model)
            ),
            refine_within=plan.refine_within,
            arrivals=arrivals,
        ),
        slo=SloSearch(
            slos=plan.slos,
            p99_s=plan.slos.largest,
            resolution=plan.resolution,
            decide_windows=plan.decide_windows,
            max_steps=plan.slo_steps,
            max_seconds=plan.slo_seconds,
            confidence=plan.confidence,
        ),
        workers=Workers(local=load_workers, metrics_port=metrics_port),
        provenance=Provenance(
            machine_name=machine_name, fleet=str(fleet) if fleet is not None else "", cold_start_s=cold_start_s
        ),
    )
