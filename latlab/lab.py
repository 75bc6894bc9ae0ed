"""`latlab lab`: the built-in CPU plan, end to end: export, serve, sweep, report; stops all it started."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from latlab import procs

GRAFANA_DIR = Path(__file__).resolve().parent.parent / "grafana"

# Batching off (max batch 1) and on, for each model. One ORT thread without spinning leaves the
# second core to HTTP handling and the load generator: measured on 2 cores, the batched ffn held
# p99 <= 50 ms to ~1000 req/s this way, ~500 req/s with ORT's default (all cores, spinning).
PLAN = {
    "models": {"mlp": {}, "ffn": {"d_model": 128, "n_layers": 128}},
    "batching": {"b1": {"max_batch_size": 1}, "batch": {"max_batch_size": 64, "max_queue_delay_ms": 2.0}},
    "cpu": {"intra_op_threads": 1, "allow_spinning": False},
    "rates": [100, 250, 500, 750, 1000, 1250, 1500, 1750, 2000, 2500, 3000],
    "step_seconds": 3.0,       # three 1 s windows; an unstable step gets one more
    "max_windows": 4,
    "warmup_seconds": 1.0,
    "slos": "25ms,50ms,100ms",
}


def _say(message: str) -> None:
    print(f"[lab {time.strftime('%H:%M:%S')}] {message}", flush=True)


def ensure_models(models_dir: Path) -> dict[str, Path]:
    """Export the plan's models unless an export with the same settings is already there."""
    from latlab.export.onnx_export import export, load_metadata
    from latlab.export.zoo import BUILDERS

    paths = {}
    for name, settings in PLAN["models"].items():
        path = models_dir / name / "model.onnx"
        try:
            current = load_metadata(models_dir / name).get("config", {})
        except FileNotFoundError:
            current = None
        zoo = BUILDERS[name](**settings)
        if current == zoo.config and path.is_file():
            _say(f"model {name} up to date: {path}")
        else:
            started = time.perf_counter()
            meta = export(name, zoo, models_dir, source=f"latlab zoo: {name}({zoo.config})")
            _say(f"exported {name} ({meta['params']:,} params, parity rel error "
                 f"{meta['parity']['max_rel_error']:.1e}) in {time.perf_counter() - started:.1f} s")
        paths[name] = path.resolve()
    return paths


def write_config(run_dir: Path, models: dict[str, Path], port: int) -> Path:
    """The lab's server config: every model twice, batching off and on."""
    cpu = "".join(f"{k} = {str(v).lower()}\n" for k, v in PLAN["cpu"].items())
    blocks = [f"[server]\nhost = \"127.0.0.1\"\nport = {port}\n"]
    for model, path in models.items():
        for mode, batcher in PLAN["batching"].items():
            settings = "".join(f"{k} = {v}\n" for k, v in batcher.items())
            blocks.append(f"[[deployments]]\nname = \"{model}-{mode}\"\nmodel = \"{model}\"\n"
                          f"model_path = \"{path}\"\nprovider = \"cpu\"\n"
                          f"[deployments.cpu]\n{cpu}[deployments.batcher]\n{settings}")
    config = run_dir / "lab.toml"
    config.write_text("\n".join(blocks))
    return config


def start_prometheus(run_dir: Path, jobs: dict[str, list[str]]) -> subprocess.Popen | None:
    """A real Prometheus scraping the server and the load generator every second, storing into the run
    folder; without Debian's `prometheus` the lab goes on and says so."""
    from latlab import prometheus

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
    _say(f"Prometheus on {url} (data: {run_dir / 'prometheus'}); e.g. "
         f"{url}/graph?g0.expr=latlab_loadtest_step_p99_seconds")
    grafana = "http://127.0.0.1:3000"
    if not procs.port_free(3000):
        _say(f"Grafana seems to run on {grafana}: dashboards Serving, Load test, CPU vs GPU "
             f"(datasource {'ok' if port == 9090 else f'expects :9090, set it to {url}'})")
    else:
        _say("Grafana: not running; see grafana/README.md to start it with the shipped dashboards")
    (run_dir / "prometheus.url").write_text(url + "\n")
    return process


def deployments_of(models: dict[str, Path]) -> list[str]:
    return [f"{model}-{mode}" for model in models for mode in PLAN["batching"]]


def run_lab(runs_dir: Path, models_dir: Path, step_seconds: float | None = None,
            rates: list[float] | None = None) -> Path:
    """Run the whole plan; returns the report's path. Every child is stopped, also on Ctrl-C."""
    from latlab.cli import new_run_id, parse_slos
    from latlab.loadtest.report import write_report

    started = time.perf_counter()
    run_dir = runs_dir / new_run_id()
    run_dir.mkdir(parents=True, exist_ok=True)
    _say(f"run folder {run_dir}")
    _say("step 1/4: exporting models")
    models = ensure_models(models_dir)
    port = procs.free_port()
    config = write_config(run_dir, models, port)
    host = f"http://127.0.0.1:{port}"
    _say(f"step 2/4: starting the server on {host} (log: {run_dir / 'server.log'})")
    server = procs.start([sys.executable, "-m", "latlab.cli", "serve", "--config", str(config)],
                         log_path=run_dir / "server.log")
    loadtest = prometheus_process = None
    metrics_port = procs.free_port()
    try:
        procs.wait_ready(f"{host}/v2/health/ready", server, log_path=run_dir / "server.log")
        prometheus_process = start_prometheus(run_dir, {"latlab-server": [f"127.0.0.1:{port}"],
                                                        "latlab-loadgen": [f"127.0.0.1:{metrics_port}"]})
        _say("step 3/4: sweeping offered load per deployment (Locust, open loop)")
        args = [sys.executable, "-m", "latlab.cli", "loadtest", "--host", host, "--out", str(run_dir),
                "--rates", ",".join(f"{r:g}" for r in (rates or PLAN["rates"])),
                "--step-seconds", str(step_seconds or PLAN["step_seconds"]),
                "--max-windows", str(PLAN["max_windows"]),
                "--warmup-seconds", str(PLAN["warmup_seconds"]), "--metrics-port", str(metrics_port)]
        for deployment in deployments_of(models):
            args += ["--deployment", deployment]
        loadtest = procs.start(args)
        if loadtest.wait() != 0:
            raise RuntimeError(f"load test failed with status {loadtest.returncode}")
    finally:
        for child in (loadtest, server, prometheus_process):
            if child is not None:
                procs.stop(child)
    _say("step 4/4: writing the report")
    report = write_report(run_dir, parse_slos(PLAN["slos"]))
    _say(f"done in {time.perf_counter() - started:.0f} s")
    print(f"report: {report.resolve()}")
    return report
