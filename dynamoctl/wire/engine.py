"""Engine payloads: what a worker's ``generate`` endpoint takes and streams, its model card
and its load, as they travel on the request plane, the event plane and in discovery."""

from __future__ import annotations

from typing import Any, Literal, TypeAlias

import msgspec

from dynamoctl.wire.ids import TokenIds, dec_hook, enc_hook
from dynamoctl.wire.structured import OutputSpec, OutputTraits

FinishReason: TypeAlias = Literal["stop", "length", "abort"]
"""``stop``: a stop token; ``length``: ``max_tokens`` reached; ``abort``: cancelled."""


class GenerateRequest(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """One generation: a tokenised prompt in, token ids out."""

    request_id: str
    """Unique among the engine's live requests; used by :meth:`Engine.abort`."""
    token_ids: TokenIds
    """The prompt, tokenised (packed: :mod:`dynamoctl.wire.ids`; a list works in process
    and on the wire too, and is decoded as the array)."""
    max_tokens: int
    """Most tokens to generate (>= 1)."""
    stop_token_ids: list[int] = []
    """End-of-sequence ids: generation ends after emitting any of these (the token is
    included in the output); the frontend puts the model's EOS here."""
    ignore_eos: bool = False
    """Ignore ``stop_token_ids`` (not ``user_stop_token_ids``): generate up to
    ``max_tokens`` (benchmarks)."""
    seed: int | None = None
    """Sampling seed; None: engine's choice (the mocker derives one from ``request_id``)."""
    temperature: float | None = None
    """Sampling temperature; None: engine default."""
    kv_transfer_params: dict[str, Any] | None = None
    """Disaggregation hand-off, opaque to dynamoctl: what a prefill worker returned on its
    last chunk, given to the decode worker (vLLM's ``kv_transfer_params``, SGLang's
    bootstrap info, TensorRT-LLM's disaggregated params). The last field, with a default:
    a request from a peer that predates it decodes with None."""
    # Sampling beyond seed and temperature (docs/api.md): appended, with defaults, so a
    # request from a peer that predates them decodes as "engine default".
    top_p: float | None = None
    top_k: int | None = None
    """None, 0 or -1: off."""
    min_p: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    logit_bias: dict[int, float] | None = None
    """Token id → bias added to its logit, in [-100, 100]."""
    min_tokens: int = 0
    """No token of ``stop_token_ids`` or ``user_stop_token_ids`` ends generation before
    this many output tokens."""
    user_stop_token_ids: list[int] = []
    """The client's own stop token ids (vLLM's ``stop_token_ids``): generation ends after
    emitting any of these, even with ``ignore_eos``."""
    logprobs: int | None = None
    """Return each output token's log-probability and this many most likely
    alternatives (0: the sampled token's only); None: no log-probabilities."""
    # -- structured outputs and tools (dynamoctl.structured; docs/api.md) --
    output: OutputSpec | None = None
    """Guided decoding and what a simulator needs to shape its output; None: free text."""
    prompt_logprobs: int | None = None
    """Return each prompt token's log-probability (the first has none) and this many most
    likely alternatives (vLLM's ``prompt_logprobs``); None: none."""
    pooling: Pooling | None = None
    """Embed the prompt instead of generating (an embedding model's pooling runner): the
    one chunk carries :attr:`GenerateChunk.embedding` and no token; None: generate."""
    images: list[ImageInput] = []
    """The images of a chat prompt, in order, each over its run of placeholder tokens in
    ``token_ids`` (docs/api.md, "Images"); empty for a text prompt."""
    adapter: str | None = None
    """The LoRA adapter to generate with (its served name, loaded on the worker); None:
    the base model. It seeds the prompt's block hash chain (:mod:`dynamoctl.kv.hashing`)."""
    trace_context: str | None = None
    """The W3C ``traceparent`` of the frontend's span for this attempt, so the worker's
    spans (and the engine's own, vLLM's) join the request's trace; None: not traced
    (docs/operations.md, "Traces")."""
    priority: int = 0
    """The request's priority class's ``priority`` (docs/security.md, "Priority
    classes"): an engine started with priority scheduling (a pool's
    ``priority_scheduling``) admits higher values first; others ignore it."""


class ImageInput(msgspec.Struct, array_like=True, gc=False):
    """One image of a prompt: its bytes and where its placeholder tokens are."""

    data: bytes
    """The image file as the client sent it (PNG, JPEG...), checked by the frontend."""
    hash: int
    """xxh3-64 of ``data``: the image's identity in KV block hashes
    (:mod:`dynamoctl.kv.images`) and the engine's multimodal cache."""
    offset: int
    """Index in ``token_ids`` of its first placeholder token."""
    tokens: int
    """Placeholder tokens it spans (the model's tokens per image)."""


class Pooling(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """What an embedding request asks of the engine's pooler."""

    dimensions: int | None = None
    """Keep the first this many dimensions (a Matryoshka model's), renormalised; None:
    the model's full size."""


class GenerateChunk(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """Tokens produced since the previous chunk of the same request."""

    token_ids: list[int]
    """New output tokens, in order (possibly several if the reader fell behind)."""
    finish_reason: FinishReason | None = None
    """Set on the last chunk only."""
    cached_tokens: int | None = None
    """First chunk only: prompt tokens served from the prefix cache (not recomputed)."""
    prompt_tokens: int | None = None
    """First chunk only: prompt length in tokens."""
    kv_transfer_params: dict[str, Any] | None = None
    """Set by a prefill worker (the last chunk for vLLM and TensorRT-LLM, the first for
    SGLang): pass it on in the decode worker's :attr:`GenerateRequest.kv_transfer_params`."""
    logprobs: list[TokenLogprobs] | None = None
    """With :attr:`GenerateRequest.logprobs`: one entry per token of ``token_ids``."""
    prompt_logprobs: list[TokenLogprobs | None] | None = None
    """With :attr:`GenerateRequest.prompt_logprobs`: the next prompt tokens' entries, in
    order from the first (None: the first token, which nothing precedes); an engine may
    spread them over several chunks."""
    embedding: list[float] | None = None
    """With :attr:`GenerateRequest.pooling`: the prompt's embedding, on the last chunk."""


class TokenLogprobs(msgspec.Struct, array_like=True, gc=False):
    """One output token's log-probability and its most likely alternatives."""

    logprob: float
    """Of the sampled token."""
    top_ids: list[int] = []
    """The most likely tokens, most likely first."""
    top_logprobs: list[float] = []
    """Their log-probabilities, aligned with ``top_ids``."""
    rank: int | None = None
    """The token's rank among all (1: the most likely); None: not known. Prompt tokens
    carry it (vLLM's ``prompt_logprobs`` reports it)."""


class ModelCard(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """What the router and frontend need to know about an engine (registered in discovery
    under ``{ns}/models/{model}/{instance_id}``)."""

    model: str
    """Served model name."""
    tokenizer: str
    """Where the frontend loads the tokenizer from (a Hugging Face id or a path)."""
    block_size: int
    """Tokens per KV block: the router hashes prompts with this block size."""
    kv_capacity_blocks: int
    """KV cache size in blocks."""
    max_num_seqs: int
    """Most requests running at once."""
    max_num_batched_tokens: int
    """Token budget of one engine step."""
    context_length: int
    """Longest prompt + output, in tokens."""
    # -- structured outputs and tools (dynamoctl.structured; docs/api.md) --
    traits: OutputTraits | None = None
    """The engine and the model's output parsers; set by the worker (its options)."""
    embedding: EmbeddingTraits | None = None
    """Set when the engine runs an embedding model (its pooling runner): it serves
    ``/v1/embeddings``, not text generation."""
    vision: VisionTraits | None = None
    """Set when the model takes images in chat (``image_url`` parts); None: refused."""
    parent: str | None = None
    """Set on a LoRA adapter's card: the base model it adapts (``model`` is then the
    adapter's name, served in ``/v1/models`` with this as its ``parent``)."""

    @property
    def adapter(self) -> str | None:
        """The adapter a request for this model generates with; None: a base model."""
        return self.model if self.parent is not None else None


class VisionTraits(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """How a vision-language model's prompt carries an image."""

    placeholder: str
    """The text its chat template writes for an image (LLaVA's ``<image>``); the frontend
    puts it where each image part is, so the template places it."""
    token_id: int
    """The placeholder's token id: each image is a run of it in the prompt's ids."""
    tokens_per_image: int
    """Length of that run: the image's tokens (a fixed-resolution vision tower's)."""
    at_start: bool = False
    """The model takes its images before the prompt (BLIP-2): the runs go first, in order,
    and the chat template sees no placeholder; else each run is where its part is."""


class EmbeddingTraits(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """An embedding model's facts the frontend checks requests against."""

    size: int
    """Dimensions of its embeddings."""
    matryoshka: bool = False
    """Its embeddings may be shortened to their first ``dimensions`` (a Matryoshka
    model's); otherwise a request's ``dimensions`` other than ``size`` is refused."""


class LoadMetrics(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """An engine's load at one instant (the router's and planner's view of a worker)."""

    active_blocks: int
    """KV blocks held by requests (cached blocks nobody holds are not counted)."""
    total_blocks: int
    """KV capacity in blocks."""
    num_waiting: int
    """Requests queued, not yet scheduled (including preempted ones)."""
    num_running: int
    """Requests scheduled: prefilling or decoding."""
    prefill_tokens_queued: int
    """Prompt tokens accepted but not yet prefilled (waiting and partly prefilled)."""
    kv_usage: float
    """``active_blocks / total_blocks``."""
    startup_s: float | None = None
    """Seconds (engine time) it took from start to ready, when the engine simulates its
    start-up (the mocker): what the planner reads as the pool's start-up time."""


_encoder = msgspec.msgpack.Encoder(enc_hook=enc_hook)
_request_decoder = msgspec.msgpack.Decoder(GenerateRequest, dec_hook=dec_hook)
_chunk_decoder = msgspec.msgpack.Decoder(GenerateChunk)
_load_decoder = msgspec.msgpack.Decoder(LoadMetrics)


def encode(message: GenerateRequest | GenerateChunk | LoadMetrics) -> bytes:
    """msgpack body of a ``generate`` request or chunk, or a load-stream payload."""
    return _encoder.encode(message)


def decode_request(payload: bytes) -> GenerateRequest:
    return _request_decoder.decode(payload)


def decode_chunk(payload: bytes) -> GenerateChunk:
    return _chunk_decoder.decode(payload)


def decode_load(payload: bytes) -> LoadMetrics:
    return _load_decoder.decode(payload)
