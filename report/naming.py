"""How the report names a curve: its provider (CPU, a device, or unknown), its server, its batcher settings and
variant, its machine, and the group a table's row of best deployments stands for."""

from __future__ import annotations

from dataclasses import replace

from latlab.loadtest.results import Curve

UNKNOWN = "?"
"""The provider of a deployment whose record does not say: one served by another server (Triton, MLServer) whose
run gave no --provider and whose model config does not tell, or a curve rebuilt from Prometheus. Neither CPU nor
GPU in any verdict: every text says "provider unknown" and how to record it (PROVIDER_HINT)."""
PROVIDER_HINT = "`latlab loadtest --provider cpu|cuda` records it"
SERVER_NAMES = {"latlab": "latlab", "triton": "Triton", "mlserver": "MLServer", "kserve": "KServe"}
"""GET /v2's `name` of known servers -> how the report writes it."""


def provider_of(curve: Curve) -> str:
    """The deployment's execution provider, lower case ("cpu", "cuda", "tensorrt"); UNKNOWN when not recorded."""
    return str(curve.provider or UNKNOWN).lower()


def is_gpu(curve: Curve) -> bool:
    """A device deployment (a recorded provider other than the CPU's); an unknown provider is not one."""
    return provider_of(curve) not in ("cpu", UNKNOWN)


def is_cpu(curve: Curve) -> bool:
    return provider_of(curve) == "cpu"


def server_name(curve: Curve) -> str:
    """The server that served the curve, by GET /v2's name ("latlab", "Triton", "MLServer"); results from before
    the server was recorded come from latlab's own."""
    name = str((curve.server or {}).get("name") or "latlab")
    return SERVER_NAMES.get(name.lower(), name)


def server_names(curves: list[Curve]) -> list[str]:
    """The servers of these curves, latlab's first, then alphabetically."""
    return sorted({server_name(c) for c in curves}, key=lambda name: (name != "latlab", name.lower()))


def tag_servers(curves: list[Curve]) -> list[Curve]:
    """The curves, each a copy with `by_server` set, when they come from more than one server: labels, tables,
    curves and the answer then name each curve's server. A one-server set is left as it is (its report renders
    without the server dimension)."""
    if len(server_names(curves)) < 2:
        return curves
    return [replace(c, by_server=True) for c in curves]


def by_server(curves: list[Curve]) -> bool:
    """Whether these curves are compared by server (tagged by tag_servers, or from more than one server)."""
    return any(c.by_server for c in curves) or len(server_names(curves)) > 1


def provider_text(curve: Curve) -> str:
    provider = curve.provider
    return "provider unknown" if provider_of(curve) == UNKNOWN else str(provider)


def batching_text(curve: Curve, short: bool = True) -> str:
    """The batcher settings in a few words: latlab's batcher ("batch ≤ 64, wait ≤ 2 ms", short; "batching ≤ 64,
    wait ≤ 2 ms"), Triton's dynamic batcher from its model config, or "batcher settings unknown"."""
    batcher = curve.batcher
    if batcher is None or not batcher.says("max_batch_size") or batcher.max_batch_size is None:
        return "batcher settings unknown" if short else "batching unknown"
    size, delay = batcher.max_batch_size, batcher.max_queue_delay_ms
    if curve.server_config is not None:  # Triton's model config: its dynamic batcher
        return "no dynamic batcher" if size == 1 else f"dynamic batcher ≤ {size}, wait ≤ {delay:g} ms"
    text = "batching off" if size == 1 else f"{'batch' if short else 'batching'} ≤ {size}, wait ≤ {delay:g} ms"
    return f"{variant_text(curve)}, {text}" if curve.variant else text


def variant_text(curve: Curve) -> str:
    """A variant's name and its accuracy against FP32 ("INT8 (min embedding cosine similarity to FP32 0.988)");
    "FP32" for the export itself."""
    if not curve.variant:
        return "FP32"
    accuracy = curve.variant.get("accuracy") or {}
    figure = accuracy.get("figure")
    kept = f" ({accuracy.get('label')} {figure:.3f})" if isinstance(figure, (int, float)) else ""
    return f"{str(curve.variant.get('name', 'variant')).upper()}{kept}"


def label(curve: Curve) -> str:
    """A deployment in words: name, provider and batcher settings; its server first when the report compares
    servers (`by_server`)."""
    server = f"{server_name(curve)}, " if curve.by_server else ""
    return f"{curve.name} ({server}{provider_text(curve)}, {batching_text(curve)})"


def machine_name(curve: Curve) -> str:
    """What the machine is: its recorded `name` (server environment, then run), else its GPU (for a device
    deployment) or CPU model. Never the hostname: every lab VM is called `vm`."""
    environment, run = curve.environment or {}, curve.machine or {}
    gpu = environment.get("gpu") or run.get("gpu")
    for name in (
        environment.get("name"),
        run.get("name"),
        gpu if is_gpu(curve) else None,
        environment.get("cpu"),
        run.get("cpu"),
    ):
        if name:
            return str(name)
    return "unnamed machine"


def group_name(curve: Curve, servers: bool) -> str:
    """What a table's row or column of best deployments stands for: the provider ("cpu", "provider unknown"),
    after the server when servers are compared ("MLServer, provider unknown")."""
    provider = provider_of(curve) if provider_of(curve) != UNKNOWN else "provider unknown"
    return f"{server_name(curve)}, {provider}" if servers else provider
