"""What a server says of one of its deployments, to label its curve: latlab's GET .../config, else what any Open
Inference Protocol server's standard routes say (and a Triton model config's batching settings where /config answers
one); its batcher, provider and padding settings read into common/settings.py's types. And the one progress line
saying which of latlab's extras a server lacks."""

from __future__ import annotations

import requests

from latlab.common.settings import TABLES, BatcherSettings
from latlab.loadtest.scrape import MetricsSource, fetch, server_info


def describe(host: str, deployment: str) -> dict:
    """The deployment's settings as the server reports them, to label the curve (keyed as the curve's fields, its
    settings tables typed): latlab's GET .../config. On any other OIP server, what its standard routes say (the
    name, the model's platform, GET /v2's server name and version; a Triton model config's batching settings where
    /config answers one) and, in `settings_unknown`, why the batcher settings are not known. LookupError, naming
    the route and its answer, when the server has no such model."""
    config_path, metadata_path = f"/v2/models/{deployment}/config", f"/v2/models/{deployment}"
    response = fetch(host, config_path, timeout=10)
    config = _json_or_none(response) if response.status_code == 200 else None
    server = {k: v for k, v in (server_info(host) or {}).items() if k in ("name", "version")}
    if isinstance(config, dict) and isinstance(config.get("batcher"), dict):  # latlab's own
        return _typed({**config, **({"server": server} if server and "server" not in config else {})})
    metadata = fetch(host, metadata_path, timeout=10)
    if metadata.status_code != 200:
        raise LookupError(
            f"server at {host} has no model '{deployment}': GET {metadata_path} answered "
            f"{metadata.status_code} {metadata.text.strip()[:200]}"
        )
    found = _json_or_none(metadata)
    if not isinstance(found, dict):
        raise LookupError(
            f"server at {host}: GET {metadata_path} answered 200 but not a JSON object: {metadata.text.strip()[:200]}"
        )
    info: dict = {
        "name": deployment,
        "model": str(found.get("name") or deployment),  # the name the server gives it
        **({"platform": found["platform"]} if found.get("platform") else {}),
        **({"server": server} if server else {}),
    }
    batcher = triton_batcher(config) if isinstance(config, dict) else None
    if batcher is not None:
        info.update(batcher=batcher, server_config=config)
        provider = triton_provider(config)
        if provider:
            info.update(provider=provider, provider_from="Triton model config (instance_group kind)")
    else:
        answer = (
            f"answered {response.status_code}"
            if response.status_code != 200
            else "answered no JSON"
            if config is None
            else "answered a config that is not latlab's"
        )
        info["settings_unknown"] = f"GET {config_path} {answer}"
    return info


def triton_batcher(config: dict) -> BatcherSettings | None:
    """The batcher settings a Triton model configuration (GET .../config on Triton) says: its maximum batch (no
    dynamic batcher: every request runs alone), queue delay and instance count, and no others; None for any other
    JSON."""
    if "max_batch_size" not in config or not any(
        k in config for k in ("dynamic_batching", "instance_group", "backend", "platform")
    ):
        return None
    dynamic = config.get("dynamic_batching")
    size = int(config["max_batch_size"] or 0)
    said: dict = {"max_batch_size": max(1, size) if isinstance(dynamic, dict) else 1}  # Triton's record, read here
    if isinstance(dynamic, dict):
        said["max_queue_delay_ms"] = float(dynamic.get("max_queue_delay_microseconds") or 0) / 1000.0
    groups = [g for g in config.get("instance_group") or [] if isinstance(g, dict)]
    if groups:
        said["instances"] = sum(int(g.get("count") or 1) for g in groups)
    return BatcherSettings.from_mapping(said)


def triton_provider(config: dict) -> str | None:
    """What a Triton model computes on, from its config's instance groups: "cuda" (KIND_GPU; "tensorrt" for a
    TensorRT plan) or "cpu" (KIND_CPU); None when they differ or say KIND_AUTO/KIND_MODEL, and for the Python
    backend, whose code, not its instance kind, picks the device."""
    if str(config.get("backend") or "").lower() == "python":
        return None
    groups = [g for g in config.get("instance_group") or [] if isinstance(g, dict)]
    kinds = {str(g.get("kind") or "KIND_AUTO").upper() for g in groups}
    if kinds == {"KIND_GPU"}:
        return "tensorrt" if str(config.get("platform") or "").lower() == "tensorrt_plan" else "cuda"
    return "cpu" if kinds == {"KIND_CPU"} else None


def _json_or_none(response: requests.Response) -> object:
    try:
        return response.json()
    except ValueError:
        return None


def _typed(record: dict) -> dict:
    """A /config record with its settings tables as common/settings.py's types; one that is no JSON object (null) is
    left out, as the curve then records none."""
    return {
        key: TABLES[key].from_mapping(value) if key in TABLES else value
        for key, value in record.items()
        if key not in TABLES or isinstance(value, dict)
    }


def extras_notice(host: str, info: dict, source: MetricsSource, given: bool = False) -> tuple[str, str] | None:
    """The one progress line saying which of latlab's extras the server lacks and what that costs, and a key
    for saying it once per run (the same absence on the next deployment is not said again); None when nothing
    is missing. `given`: the metrics URL came from --server-metrics."""
    parts, key = [], [host.rstrip("/")]
    if info.get("settings_unknown"):
        parts.append(f"{info['settings_unknown']} (not a latlab server?): batcher settings unknown")
        key.append("config")
    elif info.get("server_config") is not None:
        parts.append("no latlab /config: batcher settings from its Triton model config")
        key.append("triton-config")
    if source.kind is None:
        hint = "check --server-metrics" if given else "give --server-metrics URL where it exports Triton's metrics"
        parts.append(
            f"no server figures ({source.note}; {hint}): no server-side batch sizes or time breakdown, "
            "the report shows the client side only"
        )
        key.append("no-metrics")
    elif source.kind == "triton":
        parts.append(f"server figures and batch sizes from {source.note}")
        key.append("triton")
    if not parts:
        return None
    return "|".join(key), f"server at {host.rstrip('/')}: " + "; ".join(parts)
