"""The mocker's arguments: Dynamo's mocker defaults, which mirror vLLM's engine arguments."""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any, Literal

import msgspec

from dynamoctl.engines.mocker.sampling import EosDistribution
from dynamoctl.engines.mocker.spec import KV_BYTES_PER_TOKEN, NUM_GPU_BLOCKS
from dynamoctl.engines.mocker.startup import StartupOptions
from dynamoctl.kv.tiers import DEFAULT_DISK_GBPS, DEFAULT_HOST_GBPS


class PerfModelOptions(StartupOptions, frozen=True, kw_only=True):
    """Which timing source a mocker uses (recipe ``engine_args``; inherited by
    :class:`MockerConfig`; the sources are :mod:`.timing` and :mod:`.aic_timing`)."""

    perf_model: Literal["polynomial", "aic"] = "polynomial"
    """``polynomial``: Dynamo's published curves (:mod:`.timing`); ``aic``: AI
    Configurator's step latencies for the ``aic_*`` model, system, engine and parallelism
    (needs ``pip install 'dynamoctl[configure]'``)."""
    aic_model: str | None = None
    """``aic``: a model id AI Configurator ships, or a directory with its config.json."""
    aic_system: str = "h100_sxm"
    """``aic``: GPU system (``h100_sxm``, ``h200_sxm``, ``b200_sxm``, ...)."""
    aic_engine: str = "vllm"
    """``aic``: whose performance data (``vllm``, ``sglang``, ``trtllm``)."""
    aic_engine_version: str | None = None
    """``aic``: version of that data (default: AI Configurator's current)."""
    aic_tp_size: int = 1
    """``aic``: tensor parallelism of the simulated instance."""
    aic_pp_size: int = 1
    """``aic``: pipeline parallelism (stages are not overlapped: a step is a full pass)."""
    aic_dp_size: int = 1
    """``aic``: attention data parallelism (MoE models)."""
    aic_moe_tp_size: int = 1
    """``aic``: MoE tensor parallelism."""
    aic_moe_ep_size: int = 1
    """``aic``: MoE expert parallelism."""


class MockerConfig(PerfModelOptions, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Everything that shapes a simulated engine (recipe ``engine_args`` for ``mocker``);
    the timing source's options are :class:`PerfModelOptions`', which carries the
    start-up's (:class:`~.startup.StartupOptions`: one chain, as msgspec structs inherit
    fields from one base)."""

    model: str = "mocker"
    """Served model name, as the frontend exposes it."""
    tokenizer: str = "builtin"
    """Tokenizer source the frontend loads (``builtin``: the small tokenizer shipped with
    dynamoctl; or a local model directory). The mocker never tokenises; it advertises this
    in its model card."""
    num_gpu_blocks: int = NUM_GPU_BLOCKS
    """KV cache size in blocks."""
    block_size: int = 64
    """Tokens per KV block (the router hashes prompts with the same size)."""
    max_num_seqs: int = 256
    """Most requests running (prefilling or decoding) at once."""
    max_num_batched_tokens: int = 8192
    """Token budget of one engine step, prefill and decode tokens together."""
    max_model_len: int | None = None
    """Longest prompt + output; None: what fits in the KV cache
    (``num_gpu_blocks * block_size``)."""
    speedup_ratio: float = 1.0
    """Simulated seconds per real second when running on the real clock."""
    enable_prefix_caching: bool = True
    """Reuse cached blocks of a shared prefix and publish KV events; off: every prompt is
    computed in full and no events are published (as vLLM)."""
    scheduling_policy: Literal["fcfs", "priority"] = "fcfs"
    """The waiting queue's order (vLLM's ``--scheduling-policy``): ``fcfs`` by arrival;
    ``priority`` by each request's ``priority``, higher first (dynamoctl's sense: vLLM's
    own values run the other way), then by arrival, and a request short of blocks
    preempts the running request of the lowest priority, latest arrived."""
    enable_chunked_prefill: bool = True
    """Split a prompt over several steps when it exceeds the remaining token budget; off:
    a request's whole (re)computation must fit one step's budget."""
    vocab_size: int = 8187
    """Generated token ids are drawn from ``[0, vocab_size)``. The default covers the
    builtin tokenizer's ordinary tokens (its special tokens start at 8187), so generated
    text decodes and never contains an accidental end-of-turn."""
    eos_distribution: EosDistribution = "geometric"
    """How a request's output length is drawn when it may end itself (the frontend sends
    the model's end-of-sequence ids and no ``ignore_eos``): ``geometric``, ``uniform``,
    ``fixed`` or ``none`` (only ``max_tokens`` ends it); see docs/mocker.md."""
    eos_mean_tokens: float = 32.0
    """Mean output length, end-of-sequence token included, of ``eos_distribution``: short
    enough that a request without ``max_tokens`` ends within a second or so."""
    data_parallel_rank: int | None = None
    """Stamped on KV event batches (vLLM's ``data_parallel_rank``); None outside DP."""
    kv_bytes_per_token: int = KV_BYTES_PER_TOKEN
    """KV bytes of one token (all layers, K and V); a block moves ``block_size`` times
    this. The default is Llama-3-8B in bf16: 2 x 32 layers x 8 KV heads x 128 x 2 bytes."""
    kv_transfer_gbps: float = 25.0
    """Prefill → decode KV transfer bandwidth in GB/s (1e9 bytes/s) of simulated time: a
    decode worker waits ``bytes / bandwidth`` before a pulled prompt is in its cache."""
    kv_pin_ttl: float = 30.0
    """Seconds (of real time) a prefill worker keeps a finished prefill's blocks pinned
    for its decode worker; unpulled blocks are freed after it."""
    num_host_blocks: int = 0
    """Host-memory KV tier in blocks (0: none): blocks the GPU pool evicts are offloaded
    there and onboarded on a later prefix hit (docs/mocker.md, "KV tiers"). At least
    ``num_gpu_blocks``: a smaller tier only churns."""
    num_disk_blocks: int = 0
    """Disk KV tier in blocks below the host tier (0: none); at least ``num_host_blocks``."""
    host_gbps: float = DEFAULT_HOST_GBPS
    """Host-to-GPU onboard bandwidth in GB/s of simulated time (PCIe 5 x16, pinned)."""
    disk_gbps: float = DEFAULT_DISK_GBPS
    """Disk-to-GPU onboard bandwidth in GB/s of simulated time (one PCIe 5 NVMe drive)."""
    disk_path: str | None = None
    """Directory of the disk tier: its free space bounds the tier (a full disk stops
    disk offload, serving continues); None: only ``num_disk_blocks`` does."""
    max_loras: int = 0
    """Most LoRA adapters loaded at once (vLLM's ``--max-loras``); 0: LoRA off, every
    adapter refused (docs/api.md, "LoRA adapters")."""
    lora_load_s: float = 0.5
    """Simulated seconds loading one adapter takes (reading and placing its weights)."""
    disk_offload_filter: bool = True
    """Write a block to disk only once reused (frequency >= 2: starts at 1, doubles per
    hit, decays by 1 per ``disk_filter_decay_s``), to spare the drive; off: every host
    eviction goes down."""
    disk_filter_decay_s: float = 600.0
    """Simulated seconds per unit of frequency decay in the disk-offload filter."""

    nnodes: int = 1
    """Nodes of a multi-node replica (vLLM's ``--nnodes``); above 1 this engine is the
    gang's leader and each step is a round trip with every follower (docs/mocker.md)."""
    node_rank: int = 0
    """This member's node rank (vLLM's ``--node-rank``); an engine is rank 0, followers
    run ``dynamoctl follower``."""
    master_addr: str = "127.0.0.1"
    """Address of the leader's step channel (vLLM's ``--master-addr``)."""
    master_port: int = 29501
    """Port of the leader's step channel (vLLM's ``--master-port``)."""
    collective_timeout: float = 300.0
    """Seconds the leader waits for its gang to form, and for one step's round trip,
    before its engine dies (vLLM's ``VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS``)."""
    task: Literal["generate", "embed"] = "generate"
    """``embed``: simulate an embedding model (vLLM's ``--runner pooling``): requests
    carry ``pooling`` and get one vector back after their prompt's prefill
    (:mod:`.embedding`); text generation is refused. ``generate``: the reverse."""
    embedding_size: int = 64
    """``embed``: dimensions of the embeddings."""
    matryoshka: bool = False
    """``embed``: the model may shorten its embeddings to a request's ``dimensions``."""
    image_tokens: int = 0
    """Simulate a vision-language model whose images are this many prompt tokens each
    (a run of ``image_token_id`` that the frontend puts where the chat template writes
    ``<image>``): they are prefilled and cached as any prompt token, their blocks keyed
    by the image (:mod:`dynamoctl.kv.images`). 0 (default): images are refused."""
    image_token_id: int = 0
    """``image_tokens``: the placeholder's token id (any id of the tokenizer)."""
    image_at_start: bool = False
    """``image_tokens``: the model takes its images before the prompt (as BLIP-2): the
    frontend puts their runs first instead of where the chat template places them."""
    hold_first_requests: int = 0
    """Fault injection: the first N requests this engine accepts are held before their
    first token (never scheduled, they produce nothing) until aborted or the process
    ends, so a test can kill a worker between admission and first token at a moment it
    chooses (docs/mocker.md, "Fault injection"). 0 (default): none held."""

    def __post_init__(self) -> None:
        if not 0 <= self.node_rank < self.nnodes:
            raise ValueError(f"node_rank must be in [0, nnodes), got {self.node_rank}")
        if self.hold_first_requests < 0:
            raise ValueError(f"hold_first_requests must be >= 0, got {self.hold_first_requests}")
        if not self.collective_timeout > 0:
            raise ValueError(f"collective_timeout must be > 0, got {self.collective_timeout}")
        for name in ("num_gpu_blocks", "block_size", "max_num_seqs", "max_num_batched_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2, got {self.max_model_len}")
        if self.embedding_size < 1:
            raise ValueError(f"embedding_size must be >= 1, got {self.embedding_size}")
        if self.kv_bytes_per_token < 1:
            raise ValueError(f"kv_bytes_per_token must be >= 1, got {self.kv_bytes_per_token}")
        if not (self.kv_transfer_gbps > 0 and self.kv_pin_ttl > 0):
            raise ValueError("kv_transfer_gbps and kv_pin_ttl must be > 0")
        if not self.speedup_ratio > 0:
            raise ValueError(f"speedup_ratio must be > 0, got {self.speedup_ratio}")
        if not self.eos_mean_tokens >= 1:
            raise ValueError(f"eos_mean_tokens must be >= 1, got {self.eos_mean_tokens}")
        self._check_tiers()
        if not 1 <= self.vocab_size <= 2**32:
            raise ValueError(f"vocab_size must be in [1, 2**32], got {self.vocab_size}")

    def _check_tiers(self) -> None:
        host, disk = self.num_host_blocks, self.num_disk_blocks
        if host < 0 or disk < 0:
            raise ValueError("num_host_blocks and num_disk_blocks must be >= 0")
        if not (self.host_gbps > 0 and self.disk_gbps > 0 and self.disk_filter_decay_s > 0):
            raise ValueError("host_gbps, disk_gbps and disk_filter_decay_s must be > 0")
        if disk and not host:
            raise ValueError("num_disk_blocks needs a host tier (num_host_blocks > 0) above it")
        # Capacity must not shrink going down (the reference's rule): a smaller tier
        # evicts what it just received, and offloads churn.
        if host and host < self.num_gpu_blocks:
            raise ValueError(
                f"num_host_blocks ({host}) is smaller than num_gpu_blocks "
                f"({self.num_gpu_blocks}): a tier must hold at least the tier above it"
            )
        if disk and disk < host:
            raise ValueError(
                f"num_disk_blocks ({disk}) is smaller than num_host_blocks ({host}): "
                "a tier must hold at least the tier above it"
            )

    @property
    def context_length(self) -> int:
        """Longest prompt + output in tokens."""
        return self.max_model_len or self.num_gpu_blocks * self.block_size

    @property
    def block_bytes(self) -> int:
        """KV bytes of one block."""
        return self.block_size * self.kv_bytes_per_token

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> MockerConfig:
        """Build from recipe options; errors name the offending option."""
        known = set(cls.__struct_fields__)
        for name in options:
            if name not in known:
                hint = difflib.get_close_matches(name, known, n=1)
                also = f" (did you mean --{hint[0].replace('_', '-')}?)" if hint else ""
                raise ValueError(
                    f"unknown mocker argument --{name.replace('_', '-')}{also}; valid: "
                    + ", ".join("--" + k.replace("_", "-") for k in sorted(known))
                )
        try:
            return msgspec.convert(dict(options), cls)
        except msgspec.ValidationError as exc:
            raise ValueError(f"mocker argument {exc}") from exc
