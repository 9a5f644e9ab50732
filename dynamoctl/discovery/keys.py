"""Discovery key layout (docs/discovery.md): one prefix per deployment namespace.

Every key a process writes is attached to that process's lease, so a dead process's
keys vanish on their own within the lease TTL.
"""

from __future__ import annotations

_SEP = "/"


def _check(part: str, what: str) -> str:
    if not part or _SEP in part:
        raise ValueError(f"{what} must be non-empty and contain no '/', got {part!r}")
    return part


def namespace_prefix(ns: str) -> str:
    return f"{_check(ns, 'namespace')}/"


def instances_prefix(ns: str, component: str | None = None) -> str:
    """``{ns}/instances/`` or ``{ns}/instances/{component}/``."""
    base = f"{namespace_prefix(ns)}instances/"
    return base if component is None else f"{base}{_check(component, 'component')}/"


def instance_key(ns: str, component: str, endpoint: str, instance_id: str) -> str:
    """Address, host, pid, role and model of one serving instance."""
    return (
        f"{instances_prefix(ns, component)}{_check(endpoint, 'endpoint')}/"
        f"{_check(instance_id, 'instance_id')}"
    )


def models_prefix(ns: str, model: str | None = None) -> str:
    base = f"{namespace_prefix(ns)}models/"
    # Served model names may contain '/' (``meta-llama/Llama-3``): they are kept whole
    # as the segment between ``models/`` and the trailing instance id.
    return base if model is None else f"{base}{model}/"


def model_key(ns: str, model: str, instance_id: str) -> str:
    """The model card one instance serves (tokenizer source, block size, KV capacity...)."""
    if not model:
        raise ValueError("model must be non-empty")
    return f"{models_prefix(ns, model)}{_check(instance_id, 'instance_id')}"


def events_prefix(ns: str, component: str) -> str:
    """Every events record of ``component`` in ``ns`` (what routers watch)."""
    return f"{namespace_prefix(ns)}events/{_check(component, 'component')}/"


def events_key(ns: str, component: str, instance_id: str) -> str:
    """PUB and replay addresses of one instance's event streams."""
    return f"{events_prefix(ns, component)}{_check(instance_id, 'instance_id')}"


def promotions_prefix(ns: str) -> str:
    """Every promotion asked of a warm spare in ``ns``."""
    return f"{namespace_prefix(ns)}promote/"


def promote_key(ns: str, instance_id: str) -> str:
    """The supervisor's request that the warm spare ``instance_id`` join routing (its
    standby record names the id; a restarted process has a new one, so a stale request
    never promotes it)."""
    return f"{promotions_prefix(ns)}{_check(instance_id, 'instance_id')}"


def adapters_prefix(ns: str) -> str:
    """Every LoRA adapter the deployment should serve (the supervisor's wish, no lease:
    a restarted worker loads them again)."""
    return f"{namespace_prefix(ns)}adapters/"


def adapter_key(ns: str, name: str) -> str:
    """One adapter's :class:`~dynamoctl.wire.adapters.AdapterSpec`."""
    return f"{adapters_prefix(ns)}{_check(name, 'adapter name')}"


def split_instance_key(key: str) -> tuple[str, str, str, str]:
    """Inverse of :func:`instance_key`: ``(ns, component, endpoint, instance_id)``."""
    parts = key.split(_SEP)
    if len(parts) != 5 or parts[1] != "instances":
        raise ValueError(f"not an instance key: {key!r}")
    return parts[0], parts[2], parts[3], parts[4]


def key_reload_ask_key(ns: str) -> str:
    """The latest ``dynamoctl keys reload`` asked of the frontends
    (:class:`~dynamoctl.wire.tenants.KeyReloadAsk`, no lease)."""
    return f"{namespace_prefix(ns)}keys/ask"


def key_reload_answers_prefix(ns: str) -> str:
    """Every frontend's answer to the latest key reload."""
    return f"{namespace_prefix(ns)}keys/answers/"


def key_reload_answer_key(ns: str, instance_id: str) -> str:
    """One frontend's :class:`~dynamoctl.wire.tenants.KeyReloadAnswer`, under its lease."""
    return f"{key_reload_answers_prefix(ns)}{_check(instance_id, 'instance_id')}"


def key_limit_key(ns: str, key_name: str, kind: str) -> str:
    """The deployment's shared budget of one API key (by its name, never the key) for one
    limit, ``requests``, ``tokens`` or ``concurrency`` (frontend/tenants/shared.py)."""
    return f"{namespace_prefix(ns)}limits/{_check(key_name, 'key name')}/{_check(kind, 'limit')}"
