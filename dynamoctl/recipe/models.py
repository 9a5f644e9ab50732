"""Recipe schema, version 1: everything a deployment is made of, checked when it is loaded.

Every field carries a docstring; pydantic turns them into JSON-schema descriptions and
docs/recipes.md is generated from them (``python -m dynamoctl.recipe.reference``).

Models are strict (YAML already gives real types, so ``replicas: "2"`` is a mistake, not a
string to coerce) and forbid unknown keys (a typo must not pass silently). Cross-field rules
raise :func:`rule_error` naming the offending field, so the loader can point at its line.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from dynamoctl.recipe.discovery import Discovery, EmbeddedDiscovery
from dynamoctl.recipe.fields import DnsLabel, NonEmptyStr, RecipeModel, rule_error
from dynamoctl.recipe.frontend import Frontend, check_frontend_hosts
from dynamoctl.recipe.gang_rules import check_gang
from dynamoctl.recipe.kv_offload import check_offload
from dynamoctl.recipe.model_cache import ModelCache
from dynamoctl.recipe.planner import Planner, check_planner
from dynamoctl.recipe.security import Security
from dynamoctl.recipe.targets import LocalTarget, SlurmTarget, SshTarget, Target
from dynamoctl.recipe.tasks import Task, check_task
from dynamoctl.recipe.tracing import Tracing
from dynamoctl.recipe.workers import Workers
from dynamoctl.settings import Role as Role  # the pools' names, re-exported for the plan
from dynamoctl.settings.parsers import OutputParserSettings
from dynamoctl.util.net import is_loopback

SCHEMA_VERSION = 1
"""The only recipe ``schema`` this dynamoctl reads."""


class ModelSpec(RecipeModel, OutputParserSettings):
    """The model every worker serves. Its output formats (``tool_call_parser``,
    ``reasoning_parser``) are the workers' options, declared once in
    :mod:`dynamoctl.settings.parsers`."""

    name: NonEmptyStr
    """Model name clients pass in OpenAI requests (``"model": ...``)."""
    path: NonEmptyStr
    """Weights directory or Hugging Face model id, as the engine receives it."""
    tokenizer: NonEmptyStr | None = None
    """Tokenizer directory or Hugging Face id. Default: ``path``."""
    block_size: int = Field(default=64, ge=1)
    """KV-cache block size in tokens; engines and the KV router must agree on it."""
    context_length: int | None = Field(default=None, ge=1)
    """Longest prompt plus completion, in tokens. Default: the model's own limit."""
    cache: ModelCache | None = None
    """A node-local copy of ``path``'s directory each engine reads instead of the shared
    path: ``{dir, max_bytes, when_full, fallback_to_shared, verify, stage_ahead}``
    (docs/operations.md, "Model cache"). Default: none, engines read ``path``."""
    task: Task = "generate"
    """``generate``: a language model (chat, completions, responses, messages).
    ``embed``: an embedding model, run by its engine's pooling runner (vLLM's ``--runner
    pooling``; the mocker's ``task: embed``) and served on ``/v1/embeddings`` only, in an
    ``agg`` pool; route it by load (``frontend.router.mode: least-loaded``): an embedding
    reuses no cache."""


class Supervision(RecipeModel):
    """How ``dynamoctl up`` keeps instances alive. The defaults suit real engines, which take
    minutes to load weights. Every duration is at most a day (86400 s): longer is never
    meant, and ``.inf`` would overflow the supervisor's arithmetic."""

    start_timeout: float = Field(default=600.0, gt=0, le=86400)
    """Seconds an instance may take to become READY before it counts as failed."""
    restart_budget: int = Field(default=5, ge=0)
    """Restarts allowed per instance within ``budget_window``; past it, it stays FAILED."""
    budget_window: float = Field(default=600.0, gt=0, le=86400)
    """Seconds over which restarts are counted."""
    backoff_base: float = Field(default=1.0, gt=0, le=86400)
    """First restart delay in seconds; doubles per consecutive failure, with jitter."""
    backoff_cap: float = Field(default=30.0, gt=0, le=86400)
    """Longest restart delay in seconds."""
    start_timeout_factor: float | None = Field(default=None, gt=1, le=100)
    """When set, a worker's start timeout is this many times the measured start-up of its
    model on its kind of node (the median of the recent starts, kept in the state directory;
    at least 30 s) instead of ``start_timeout``, which still applies until a start has been
    measured. Default: unset, ``start_timeout`` always."""
    hang_timeout: float = Field(default=60.0, gt=0, le=86400)
    """Seconds an instance may answer its probes unhealthy (not ready, not registered),
    or a worker with requests in flight go without generating a token, before it counts
    as hung and is restarted (the latter as WEDGED: SIGKILLed)."""
    probe_interval: float = Field(default=1.0, gt=0, le=86400)
    """Seconds between health probes of each instance."""
    probe_timeout: float = Field(default=1.0, gt=0, le=3600)
    """Seconds a READY instance's health probe waits for an answer; none within it is a
    silence (a healthy process answers its ``/health`` in milliseconds, even under load)."""
    wedge_timeout: float = Field(default=6.0, gt=0, le=86400)
    """Seconds a READY instance may answer no probe at all (frozen, deadlocked: SIGSTOP,
    a hung collective) before it is WEDGED: out of routing, its process group SIGKILLed,
    restarted. The default is twice a 3 s transient stall, which costs no restart, and
    with the default probes a wedged instance is replaced within about 8 s. It must
    exceed ``probe_interval`` + ``probe_timeout`` (one missed probe is no wedge)."""
    drain_timeout: float = Field(default=45.0, ge=0, le=86400)
    """Seconds a draining instance gets (finishing in-flight requests) before SIGKILL."""
    orphan_grace: float = Field(default=60.0, ge=0, le=86400)
    """Seconds an instance keeps running after its supervisor is gone (killed, host
    rebooted, SSH connection lost), waiting for a new ``dynamoctl up`` to adopt it; then
    its keeper stops it. ``0`` stops every instance as soon as its supervisor is gone.
    Not under Slurm, where the job ends with its supervisor (docs/operations.md,
    "Restarting the supervisor")."""
    control_host: NonEmptyStr | None = None
    """IPv4 address or host name the supervisor's control endpoint (``status``, ``drain``,
    ``scale``, ``down``, ``/metrics``) listens on; ``state.json`` and discovery record its
    URL with this host. For ``0.0.0.0`` they record this machine's host name if it resolves
    to the address this machine reaches the head host from, else that address (a name
    mapped to 127.0.1.1 would send the planner on the head host to itself). Default:
    ``127.0.0.1`` for a local target; ``0.0.0.0`` for ssh and slurm, so that commands on a
    login node that shares the run directory reach it. Every route but ``/metrics`` needs
    the token in ``state.json``."""

    @model_validator(mode="after")
    def _wedge_after_a_missed_probe(self) -> Supervision:
        if self.wedge_timeout <= self.probe_interval + self.probe_timeout:
            raise rule_error(
                "wedge_timeout",
                f"{self.wedge_timeout:g} s must exceed probe_interval + probe_timeout "
                f"({self.probe_interval + self.probe_timeout:g} s): one missed probe "
                "would count as a wedge",
            )
        return self


class Recipe(RecipeModel):
    """A deployment: where it runs, how its processes find each other, what they serve."""

    schema_version: Literal[1] = Field(alias="schema")
    """Recipe schema version; must be 1."""
    name: DnsLabel
    """Deployment name: lowercase letters, digits and ``-``."""
    namespace: DnsLabel = Field(default_factory=lambda data: data.get("name", ""))
    """Prefix of every discovery key, so deployments can share one etcd. Default: ``name``."""
    discovery: Discovery = Field(default_factory=lambda: EmbeddedDiscovery(backend="embedded"))
    """How processes find each other."""
    target: Target = Field(default_factory=lambda: LocalTarget(kind="local"))
    """Where processes run."""
    model: ModelSpec
    """The served model."""
    frontend: Frontend = Field(default_factory=Frontend)
    """The HTTP endpoint and its router."""
    workers: Workers
    """Worker pools."""
    supervision: Supervision = Field(default_factory=Supervision)
    """Restart, health and drain policy of ``dynamoctl up``."""
    security: Security = Field(default_factory=Security)
    """Locks on the planes and on a managed etcd."""
    tracing: Tracing | None = None
    """OpenTelemetry traces of each request, exported by OTLP to a collector; absent: off."""
    planner: Planner | None = None
    """The SLA planner, which scales the worker pools to latency targets; absent: the
    pools keep their ``replicas`` until ``dynamoctl scale`` changes them."""

    @property
    def multi_host(self) -> bool:
        """Whether the target spans several hosts (its processes talk over a network)."""
        target = self.target
        return (isinstance(target, SshTarget) and len(target.hosts) > 1) or (
            isinstance(target, SlurmTarget) and target.nodes > 1
        )

    @model_validator(mode="after")
    def _fits_target(self) -> Recipe:
        target = self.target
        if self.multi_host and isinstance(self.discovery, EmbeddedDiscovery):
            raise rule_error(
                "discovery.backend",
                "embedded discovery serves one host but the target spans several; "
                "use backend: etcd (with managed: true to let dynamoctl run it)",
            )
        host = self.frontend.host
        if not isinstance(target, LocalTarget) and host is not None and is_loopback(host):
            raise rule_error(
                "frontend.host",
                f"{host} is reachable only on the head node itself, not by the supervisor or "
                f"clients elsewhere on a {target.kind} target; leave it out to listen on the "
                "head node's address, or use 0.0.0.0",
            )
        if self.frontend.hosts > 1:
            check_frontend_hosts(self.frontend.hosts, host, target)
        router = self.frontend.router
        if router.disaggregation == "required" and self.workers.prefill is None:
            raise rule_error(
                "frontend.router.disaggregation",
                "required needs a prefill pool (add workers.prefill) or use auto",
            )
        for role, pool in self.workers.pools().items():
            if pool.nodes_per_replica > 1:
                check_gang(role, pool, target)
            check_offload(role, pool.engine, pool.kv_offload, pool.gpus_per_replica,
                          pool.engine_args, self.model.block_size)  # fmt: skip
        check_task(self.model.task, self.workers.pools())
        if self.planner is not None:
            check_planner(self.planner, self.workers.pools(), self.model.name)
        if isinstance(target, SlurmTarget):
            for role, pool in self.workers.pools().items():
                if pool.nodes_per_replica == 1 and pool.gpus_per_replica > target.gpus_per_node:
                    raise rule_error(
                        f"workers.{role}.gpus_per_replica",
                        f"{pool.gpus_per_replica} GPUs per replica exceed target.gpus_per_node"
                        f" = {target.gpus_per_node}; a replica must fit on one node",
                    )
        return self
