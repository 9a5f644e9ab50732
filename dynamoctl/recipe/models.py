"""Recipe schema, version 1: everything a deployment is made of, checked when it is loaded.

Every field carries a docstring; pydantic turns them into JSON-schema descriptions and
docs/recipes.md is generated from them (``python -m dynamoctl.recipe.reference``).

Models are strict (YAML already gives real types, so ``replicas: "2"`` is a mistake, not a
string to coerce) and forbid unknown keys (a typo must not pass silently). Cross-field rules
raise :func:`rule_error` naming the offending field, so the loader can point at its line.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Discriminator, Field, Tag, model_validator

from dynamoctl.engines import registry
from dynamoctl.recipe.fields import (
    DnsLabel,
    LocalPath,
    NonEmptyStr,
    OneOf,
    Port,
    RecipeModel,
    check_etcd_endpoint,
    rule_error,
)
from dynamoctl.recipe.gang_rules import GANG_FLAGS, check_gang
from dynamoctl.recipe.kv_offload import KvOffload, check_offload
from dynamoctl.recipe.lora import Lora
from dynamoctl.recipe.model_cache import ModelCache
from dynamoctl.recipe.planner import Planner, check_planner
from dynamoctl.recipe.targets import LocalTarget, SlurmTarget, SshTarget, Target
from dynamoctl.recipe.tasks import Task, check_task
from dynamoctl.recipe.tracing import Tracing
from dynamoctl.settings import (
    AdmissionSettings,
    DisaggSettings,
    ImageSettings,
    ReplicaSettings,
    ResponsesSettings,
    RouterSettings,
    StreamSettings,
)
from dynamoctl.settings import Role as Role  # the pools' names, re-exported for the plan
from dynamoctl.settings.frontend import DEFAULT_PORT, ApiKeySettings
from dynamoctl.settings.http import HttpLimitSettings
from dynamoctl.settings.parsers import OutputParserSettings
from dynamoctl.util.net import is_loopback

SCHEMA_VERSION = 1
"""The only recipe ``schema`` this dynamoctl reads."""

_ENGINES = OneOf(lambda: registry.ENGINES.names())
EngineName = Annotated[str, _ENGINES, AfterValidator(_ENGINES)]
"""An engine registered in :mod:`dynamoctl.engines.registry` (its names, not a copy)."""

# --- secrets and security -------------------------------------------------------------------


class SecretSource(RecipeModel):
    """Where a secret is read, on the supervisor's host, right before an instance starts:
    exactly one of ``from_env`` and ``from_file``. The value never appears in the recipe,
    the plan, ``state.json``, a dry run or a command line (docs/security.md)."""

    from_env: NonEmptyStr | None = None
    """Name of an environment variable of the supervisor (``dynamoctl up``), e.g.
    ``HF_TOKEN``."""
    from_file: LocalPath | None = None
    """Path of a file holding the value (a trailing newline is dropped), e.g.
    ``~/.cache/huggingface/token``."""

    @model_validator(mode="after")
    def _exactly_one(self) -> SecretSource:
        if (self.from_env is None) == (self.from_file is None):
            raise rule_error("", "give exactly one of from_env and from_file")
        return self


class Security(RecipeModel):
    """Who may talk to the deployment's processes (docs/security.md). The defaults lock
    every target whose components listen on a network address (ssh, slurm) and leave a
    single user's machine (local) as it is."""

    curve: bool | None = None
    """Authenticate and encrypt the request and event planes with ZeroMQ CURVE, with a
    key generated for the deployment: processes without it cannot connect. Default: on for
    ssh and slurm targets, off for local."""
    etcd_tls: bool | None = None
    """Serve a managed etcd (``discovery.managed``) over TLS with certificates made for
    the deployment, client certificates required: only the deployment's processes can
    read or write discovery. Default: on for ssh and slurm targets, off for local."""
    open_endpoint: bool = False
    """Serve the OpenAI endpoint without API keys although the target spans several hosts
    and the frontend listens on a network address. ``up`` refuses such a recipe unless it
    names keys (``frontend.api_keys_file`` or ``frontend.api_keys_env``) or says this: an
    open endpoint on a cluster network is a choice to write down, not a default."""


ENV_VALUE_TAGS = frozenset({"plain", "secret"})
"""The forms of an env value; pydantic puts the one meant in an error's location."""
EnvValue = Annotated[
    Annotated[str, Tag("plain")] | Annotated[SecretSource, Tag("secret")],
    Discriminator(lambda value: "secret" if isinstance(value, dict | SecretSource) else "plain"),
]
"""An environment value, or where a secret one is read (errors name only the form meant)."""


# --- discovery ------------------------------------------------------------------------------


class _Discovery(RecipeModel):
    backend: str
    """Discovery backend; every process registers itself there under a lease."""
    lease_ttl: float = Field(default=10.0, ge=2, le=3600)
    """Seconds a registration outlives its process's last heartbeat. A process that loses its
    lease re-acquires it and registers again; it does not exit. At most an hour: requests
    would go to a dead process for that long."""


class EmbeddedDiscovery(_Discovery):
    """Discovery without a server, for a deployment on a single host."""

    backend: Literal["embedded"]
    """``embedded``: same API and lease semantics as etcd, nothing to install."""
    path: LocalPath | None = None
    """State directory. Default: a per-user run directory chosen by dynamoctl."""


class EtcdDiscovery(_Discovery):
    """A real etcd 3.x server: needed as soon as components run on more than one host."""

    backend: Literal["etcd"]
    """``etcd``: an etcd 3.x cluster, external or started by dynamoctl."""
    endpoints: list[Annotated[str, AfterValidator(check_etcd_endpoint)]] = Field(
        default_factory=list
    )
    """Client URLs of an external etcd, e.g. ``http://10.0.0.1:2379``, or
    ``https://etcd1:2379`` for one served over TLS (all ``https`` or none). Required unless
    ``managed``."""
    managed: bool = False
    """dynamoctl starts etcd on the head node, owns it, and stops it on ``dynamoctl down``
    (over TLS with its own certificates on ssh and slurm targets: ``security.etcd_tls``)."""
    allow_plaintext: bool = False
    """Accept ``http://`` endpoints (an external etcd without TLS) on a target that spans
    several hosts: its traffic (every record, the deployment's addresses) crosses the
    network in clear and anyone who reaches it can rewrite discovery. ``up`` refuses such a
    recipe unless it says this."""
    ca_file: LocalPath | None = None
    """``https`` endpoints: PEM file of the CA that signed the etcd servers' certificates,
    on the supervisor's host. Default: the system's trusted CAs."""
    cert_file: LocalPath | None = None
    """``https`` endpoints: PEM client certificate, for an etcd that requires one
    (``--client-cert-auth``); with ``key_file``."""
    key_file: LocalPath | None = None
    """PEM private key of ``cert_file``."""
    username: NonEmptyStr | None = None
    """``https`` endpoints: etcd user, for an etcd with authentication enabled; with
    ``password``."""
    password: SecretSource | None = None
    """Where that user's password is read, e.g. ``{from_env: ETCD_PASSWORD}``."""

    @model_validator(mode="after")
    def _tls_settings(self) -> EtcdDiscovery:
        tls_fields = ("ca_file", "cert_file", "key_file", "username", "password")
        given = [name for name in tls_fields if getattr(self, name) is not None]
        secure = bool(self.endpoints) and all(e.startswith("https://") for e in self.endpoints)
        if given and not secure:
            raise rule_error(given[0], "applies to https:// endpoints only")
        if any(e.startswith("https://") for e in self.endpoints) and not secure:
            raise rule_error("endpoints", "must be all https:// or all http://")
        if (self.cert_file is None) != (self.key_file is None):
            raise rule_error("cert_file" if self.key_file else "key_file", "needs the other")
        if (self.username is None) != (self.password is None):
            raise rule_error("password" if self.username else "username", "needs the other")
        return self

    @model_validator(mode="after")
    def _endpoints_or_managed(self) -> EtcdDiscovery:
        if self.managed and self.endpoints:
            raise rule_error(
                "endpoints", "must be empty with managed: true (dynamoctl picks the address)"
            )
        if not self.managed and not self.endpoints:
            raise rule_error(
                "endpoints", "required unless managed: true (e.g. [http://10.0.0.1:2379])"
            )
        return self


Discovery = Annotated[EmbeddedDiscovery | EtcdDiscovery, Field(discriminator="backend")]


# --- model, frontend, workers ---------------------------------------------------------------


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
    path: ``{dir, max_bytes, when_full, fallback_to_shared, verify}`` (docs/operations.md,
    "Model cache"). Default: none, engines read ``path``."""
    task: Task = "generate"
    """``generate``: a language model (chat, completions, responses, messages).
    ``embed``: an embedding model, run by its engine's pooling runner (vLLM's ``--runner
    pooling``; the mocker's ``task: embed``) and served on ``/v1/embeddings`` only, in an
    ``agg`` pool; route it by load (``frontend.router.mode: least-loaded``): an embedding
    reuses no cache."""


class Router(RecipeModel, ReplicaSettings, DisaggSettings, RouterSettings):
    """How the frontend picks a worker for each request. The routing and disaggregation
    fields are the components' own options (``dynamoctl frontend --help``), declared once
    in :mod:`dynamoctl.settings`."""

    replicas: int = Field(default=0, ge=0, le=64)
    """Standalone router processes; 0 embeds the router in the frontend. Either routes
    the prefill and decode pools alike. At most 64, far more than failover needs."""


class Frontend(
    RecipeModel,
    HttpLimitSettings,
    ApiKeySettings,
    AdmissionSettings,
    StreamSettings,
    ResponsesSettings,
    ImageSettings,
):
    """The OpenAI-compatible HTTP endpoint."""

    host: NonEmptyStr | None = None
    """Address to listen on. Default: ``127.0.0.1`` on a local target; on ssh and slurm
    targets the head node's address, so that the supervisor and clients on other machines
    reach it. ``0.0.0.0`` listens on every interface of the head node. A loopback address
    is refused on ssh and slurm targets (nothing off the head node could reach it)."""
    port: Port = DEFAULT_PORT
    """TCP port to listen on."""
    processes: int | None = Field(default=None, ge=1, le=64)
    """Frontend processes on each frontend host, all serving ``port`` (``SO_REUSEPORT``:
    the kernel spreads connections over them), each with its own embedded router; the
    routers share their bookings so that they route as one would. Each is an instance of
    its own (``frontend-0``, ``frontend-1``...), restarted and drained alone. Default:
    a quarter of the host's cores, at least 1 and at most 8, leaving the rest to the
    workers and engines beside it (1 on a 2- or 4-core host, 4 on 16 cores); the local
    target counts this machine's cores, ssh and slurm targets get 1 (the plan does not
    know their cores: set it)."""
    hosts: int = Field(default=1, ge=1, le=64)
    """Hosts running frontends: the target's first ``hosts`` (the head first), each with
    ``processes`` frontend processes on ``port``. Put a load balancer in front of them:
    ``dynamoctl lb-config`` writes an HAProxy configuration (docs/operations.md, "Many
    frontends"). More than 1 needs an ssh or slurm target with that many hosts, and
    ``host`` unset or a wildcard (one address is on one host)."""
    router: Router = Field(default_factory=Router)
    """Request routing."""

    def process_count(self, cores: int | None) -> int:
        """Frontend processes per host (``processes``, else the default from ``cores``;
        None: unknown, 1)."""
        if self.processes is not None:
            return self.processes
        return 1 if cores is None else max(1, min(8, cores // 4))


def check_frontend_hosts(hosts: int, listen: str | None, target: Target) -> None:
    """Frontends on ``hosts`` hosts need that many hosts and an address on each."""
    if isinstance(target, LocalTarget):
        raise rule_error("frontend.hosts", "a local target has one host; use processes instead")
    have = len(target.hosts) if isinstance(target, SshTarget) else target.nodes
    if hosts > have:
        raise rule_error("frontend.hosts", f"{hosts} hosts but the target has {have}")
    if listen is not None and listen not in ("0.0.0.0", "::"):
        raise rule_error(
            "frontend.host",
            f"{listen} is one host's address but frontends run on {hosts} hosts; leave it "
            "out (each listens on its host's address) or use 0.0.0.0",
        )


class WorkerPool(RecipeModel):
    """A set of identical engine replicas in one role."""

    engine: EngineName
    """Engine adapter: ``mocker`` (simulated, no GPU), ``vllm``, ``sglang`` or ``trtllm``."""
    replicas: int = Field(default=1, ge=0, le=1024)
    """Number of replicas; 0 declares the pool with nothing running (``dynamoctl scale``
    changes it later). At most 1024, each a process the supervisor probes every
    ``probe_interval``."""
    spares: int = Field(default=0, ge=0, le=64)
    """Warm spares kept beside the replicas: started and ready, but out of routing
    (``STANDBY`` in ``status``), so that ``scale`` up, or the replacement of a replica that
    failed, is a promotion in about a second instead of a start; a promoted spare is
    replaced in the background (docs/operations.md, "Warm spares"). Each holds what a
    replica holds (GPUs, memory). Replicas on one node only (``nodes_per_replica: 1``)."""
    gpus_per_replica: int = Field(default=1, ge=0, le=4096)
    """GPUs each replica gets, over all its nodes; 0 for the mocker or CPU engines. With
    ``nodes_per_replica`` > 1 it must be that many whole nodes' GPUs."""
    nodes_per_replica: int = Field(default=1, ge=1, le=64)
    """Nodes one replica (one engine instance) spans: a *gang* of a leader (node rank 0,
    the only member that registers and serves) and followers, started, restarted and
    stopped together (docs/operations.md, "Multi-node replicas"). Each member takes a whole
    node; dynamoctl gives each the engine's rank and rendezvous flags (vLLM ``--nnodes
    --node-rank --master-addr --master-port``, ``--headless`` on followers; SGLang
    ``--nnodes --node-rank --dist-init-addr``), and the engine's parallel sizes in
    ``engine_args`` must multiply to ``gpus_per_replica``. Engines: vllm, sglang, mocker;
    trtllm on a Slurm target only, as one MPI world (one ``srun --mpi=pmix`` step over
    the replica's nodes running ``trtllm-llmapi-launch``). At most 64 nodes."""
    engine_args: dict[str, Any] = Field(default_factory=dict)
    """Engine command-line arguments without the leading ``--``, passed untouched, e.g.
    ``{tensor-parallel-size: 8}``; ``true`` is a bare flag."""
    kv_offload: KvOffload | None = None
    """KV cache tiers below GPU memory (host memory, local disk, a shared store), set up
    for the pool's engine (docs/recipes.md, "KV offload"). Default: none."""
    load_format: NonEmptyStr | None = None
    """How the engine loads its weights, by the engine's own name (vLLM's and SGLang's
    ``--load-format``: ``runai_streamer`` streams safetensors with parallel reads,
    ``safetensors``, ``dummy`` random weights...); refused by name when the engine has no
    such loader (docs/engines.md, "Weight loaders"). Default: the engine's (``auto``)."""
    lora: Lora | None = None
    """LoRA adapters served beside the base model, each a model name of its own
    (docs/api.md, "LoRA adapters"); refused by name for an engine dynamoctl cannot give
    adapters. Default: none."""
    priority_scheduling: bool = False
    """Start the engine scheduling by priority (vLLM ``--scheduling-policy priority``,
    SGLang ``--enable-priority-scheduling``, the mocker's ``scheduling_policy:
    priority``): each request carries its key's class ``priority`` (docs/security.md,
    "Priority classes") and the engine admits higher ones first, so that an interactive
    request does not wait behind batch prefills inside the worker. Refused by name for
    an engine without it (trtllm)."""
    env: dict[str, EnvValue] = Field(default_factory=dict)
    """Extra environment variables for each replica. A secret (a token, a password) is
    referenced rather than written: ``HF_TOKEN: {from_env: HF_TOKEN}`` or ``{from_file:
    ~/.hf_token}``; it is then read on the supervisor's host when the replica starts and
    delivered without a command line, and the dry run shows ``<from env HF_TOKEN>``."""

    @model_validator(mode="after")
    def _known_load_format(self) -> WorkerPool:
        offered = registry.engine_spec(self.engine).load_formats
        if self.load_format is not None and self.load_format not in offered:
            raise rule_error(
                "load_format",
                f"{self.load_format!r} is not a loader of {self.engine}"
                + (f" (it has: {', '.join(offered)})" if offered else " (it has none to pick)"),
            )
        return self

    @model_validator(mode="after")
    def _engine_serves_lora(self) -> WorkerPool:
        if self.lora is not None and registry.engine_spec(self.engine).lora_args is None:
            raise rule_error(
                "lora",
                f"{self.engine} adapters are not served through dynamoctl yet (vllm and "
                "the mocker are); serve the merged model instead",
            )
        return self

    @model_validator(mode="after")
    def _engine_schedules_by_priority(self) -> WorkerPool:
        if self.priority_scheduling and registry.engine_spec(self.engine).priority_args is None:
            raise rule_error(
                "priority_scheduling",
                f"{self.engine} has no priority scheduling dynamoctl can turn on (vllm, "
                "sglang and the mocker have)",
            )
        return self

    @model_validator(mode="after")
    def _gang_flags_are_ours(self) -> WorkerPool:
        if self.spares and self.nodes_per_replica > 1:
            raise rule_error(
                "spares",
                "is for replicas on one node; a multi-node replica has no spares: a spare "
                f"gang would hold {self.nodes_per_replica} whole nodes idle, and promotion "
                "registers one standby worker, while a gang's leader and followers start "
                "and restart together (scale such a pool instead)",
            )
        if self.nodes_per_replica == 1:
            return self
        for key in self.engine_args:
            if key.replace("_", "-") in GANG_FLAGS:
                raise rule_error(
                    f"engine_args.{key}",
                    "is set by dynamoctl for each member of a multi-node replica (from "
                    "nodes_per_replica and the placement); remove it",
                )
        return self


class Workers(RecipeModel):
    """Worker pools. Either aggregated (``agg``: each replica prefills and decodes) or
    disaggregated (``prefill`` and ``decode``, KV moved between them). Mixing ``agg`` with
    the other two is rejected. ``decode`` alone is allowed: decode workers then prefill
    locally until prefill replicas are scaled up."""

    agg: WorkerPool | None = None
    """Aggregated pool: prefill and decode on the same replica."""
    prefill: WorkerPool | None = None
    """Prefill pool of a disaggregated deployment; needs ``decode``."""
    decode: WorkerPool | None = None
    """Decode pool of a disaggregated deployment."""

    def pools(self) -> dict[Role, WorkerPool]:
        """The declared pools by role, in the order agg, prefill, decode."""
        declared: dict[Role, WorkerPool | None] = {
            "agg": self.agg,
            "prefill": self.prefill,
            "decode": self.decode,
        }
        return {role: pool for role, pool in declared.items() if pool is not None}

    @model_validator(mode="after")
    def _coherent_roles(self) -> Workers:
        if self.agg is not None and (self.prefill is not None or self.decode is not None):
            mixed = "prefill" if self.prefill is not None else "decode"
            raise rule_error(
                mixed, "cannot be combined with agg; use either agg or prefill + decode"
            )
        if self.prefill is not None and self.decode is None:
            raise rule_error("prefill", "needs a decode pool (add workers.decode)")
        if not any(pool.replicas > 0 for pool in self.pools().values()):
            raise rule_error("", "needs at least one pool (agg, prefill, decode) with replicas > 0")
        return self


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
