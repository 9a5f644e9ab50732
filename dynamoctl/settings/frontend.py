"""The frontend's knobs beyond routing: conditional disaggregation, admission and API
keys (its HTTP limits are every server's, :mod:`dynamoctl.settings.http`)."""

from __future__ import annotations

import os
import re
from typing import ClassVar, Literal

from pydantic import Field, field_validator

from dynamoctl.settings.base import Options
from dynamoctl.settings.component import ComponentSettings
from dynamoctl.settings.http import HttpLimitSettings
from dynamoctl.settings.images import ImageSettings
from dynamoctl.settings.keyfile import KeyEntry, KeyFile, Limits, load_key_file
from dynamoctl.settings.routing import RouterSettings

DEFAULT_PORT = 8000
"""The frontend's HTTP port unless told (``--port``, a recipe's ``frontend.port``)."""

DisaggMode = Literal["auto", "required", "off"]


class DisaggSettings(Options):
    """When a request of a disaggregated model is prefilled on a prefill worker."""

    disaggregation: DisaggMode = "auto"
    """With prefill workers: ``auto`` prefills long prompts on a prefill worker and falls
    back to prefilling on the decode worker while none is alive; ``required`` answers 503
    instead of falling back; ``off`` never uses prefill workers."""
    min_remote_prefill_tokens: int = Field(default=256, ge=0)
    """Prompts with fewer uncached tokens than this (counted against the decode workers'
    caches) are prefilled on their decode worker: a hand-off costs more than it saves."""
    max_prefill_attempts: int = Field(default=2, ge=1)
    """Prefill workers tried per request before falling back to a local prefill (or 503
    with ``required``)."""


class AdmissionSettings(Options):
    """What happens to a request when every worker is busy."""

    queue_timeout: float = Field(default=5.0, ge=0)
    """Seconds a request waits for a worker that is not busy, then gets 503 with
    ``Retry-After``."""
    max_queued: int = Field(default=256, ge=0)
    """Requests allowed to wait at once; beyond it, 503 at once."""
    fifo_admission: bool = False
    """Fair share off: requests waiting for a busy worker get one in no particular order
    (whoever tries first when one frees up). Off by default: they are served by their
    keys' priority classes in proportion to the classes' weights, and the keys of a class
    in turn (docs/security.md, "Priority classes")."""
    max_choices: int = Field(default=64, ge=1)
    """Most choices one request may ask for (``n``, times the prompts of a batched
    completion); more is a 400, since each choice is a request to a worker. The default
    takes lm-evaluation-harness's usual ``--batch_size`` (up to 64 prompts a request)."""


class StreamSettings(Options):
    """How fast the frontend gives up on a worker that went silent under a stream."""

    stream_silence_timeout: float = Field(default=1.5, gt=0, le=60)
    """Seconds a worker may send nothing on its request-plane connection, not even the
    answer to a heartbeat (sent every quarter of this), before its open streams migrate
    to another worker and pickers skip it until it answers again: a frozen or wedged
    engine process (docs/operations.md, "Wedged instances"). A live worker answers
    heartbeats from its event loop within milliseconds, even mid-prefill; the bound
    keeps a frozen worker's streams silent for under 2 s, re-prefill included."""


class ResponsesSettings(Options):
    """The Responses API's store (docs/api.md, "Responses")."""

    max_stored_responses: int = Field(default=1024, ge=0)
    """Responses kept in the frontend's memory for ``previous_response_id`` and ``GET
    /v1/responses/{id}``, the oldest dropped first; 0 keeps none (then ``store: true``
    answers as usual and a later reference is a 404). Each frontend process keeps its own."""


class ApiKeySettings(Options):
    """Who may call the OpenAI API: with neither field set, anyone who reaches the port.

    Only where the keys are is declared, never a key: a command line is visible to every
    user of the machine, and a recipe is shared."""

    api_keys_file: str | None = None
    """File of API keys: one per line (blank lines and ``#`` comments ignored), or a YAML
    key file giving each key a name, a priority class and limits (docs/security.md, "The
    key file"). A client sends one as ``Authorization: Bearer KEY``. Read when the
    frontend starts, on the frontend's host, and again whenever it changes (a file that
    no longer validates is logged and the keys before it are kept). ``/health``,
    ``/live`` and ``/metrics`` stay open."""
    api_keys_env: str | None = None
    """Name of an environment variable of the frontend's process holding API keys,
    separated by commas or whitespace (the variable's name, not the keys); they are
    unlimited, in the default class, named ``env-1``, ``env-2``..."""

    @field_validator("api_keys_env")
    @classmethod
    def _a_name(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", value):
            raise ValueError("must be the name of an environment variable, not a key")
        return value

    def load_api_keys(self) -> list[str]:
        """The keys a client may send, from the file and the variable; [] when neither is
        set. Unlimited keys come first (the supervisor's probe and ``bench`` use the
        first). A source that is set but yields no key is an error: refusing to start
        beats serving open."""
        entries = self.load_key_file().keys if self.has_keys() else []
        plain = [e for e in entries if e.key is not None]
        plain.sort(key=lambda e: e.limits != Limits())  # stable: unlimited first
        return [e.key for e in plain if e.key is not None]

    def has_keys(self) -> bool:
        return self.api_keys_file is not None or self.api_keys_env is not None

    def load_key_file(self) -> KeyFile:
        """Every key with its name, class and limits: the file's, then the variable's."""
        keyfile = KeyFile.model_construct(classes={}, keys=[])
        if self.api_keys_file is not None:
            keyfile = load_key_file(self.api_keys_file)
        if self.api_keys_env is not None:
            found = os.environ.get(self.api_keys_env, "").replace(",", " ").split()
            if not found:
                raise ValueError(f"API key variable {self.api_keys_env} is unset or empty")
            named = [
                KeyEntry.model_construct(name=f"env-{n}", key=key)
                for n, key in enumerate(found, start=1)
            ]
            keyfile = keyfile.model_copy(update={"keys": keyfile.keys + named})
        return keyfile


class FrontendOptions(ComponentSettings):
    """Everything ``dynamoctl frontend`` is told on its command line."""

    FLAGS: ClassVar[dict[str, str]] = {"routing": "router", "route_timeout": "router-timeout"}

    port: int = Field(default=DEFAULT_PORT, ge=0, le=65535)
    """HTTP port; 0 picks a free one (logged and registered)."""
    routing: Literal["embedded", "standalone"] = "embedded"
    """Where routing decisions are made: ``embedded`` (in this process) or ``standalone``
    (ask the namespace's ``dynamoctl router`` replicas; the routing flags are then
    theirs)."""
    share_bookings: bool = False
    """Share the embedded router's bookings with the namespace's other frontends (and
    apply theirs), so that several frontend processes route as one router would; set by
    the plan when a deployment runs more than one frontend."""
    shared_limits: int = Field(default=0, ge=0, le=4096)
    """The deployment's frontend processes, when more than one: the API keys' limits then
    hold for all of them together, each taking grants from shared budgets in discovery
    (docs/security.md, "Limits"); set by the plan. 0 or 1: each process counts alone."""
    reuse_port: bool = False
    """Bind the HTTP port with ``SO_REUSEPORT`` (Linux): the frontend processes of one
    host listen on one port and the kernel spreads connections over them."""
    route_timeout: float = Field(default=1.0, ge=0.01)
    """Standalone: seconds a router replica may take to answer before the next is asked."""
    router: RouterSettings = Field(default_factory=RouterSettings)
    """Routing mode and weights of the embedded router."""
    disagg: DisaggSettings = Field(default_factory=DisaggSettings)
    """Conditional disaggregation (prefill workers)."""
    admission: AdmissionSettings = Field(default_factory=AdmissionSettings)
    """The queue in front of busy workers."""
    streams: StreamSettings = Field(default_factory=StreamSettings)
    """When a silent worker's streams migrate."""
    responses: ResponsesSettings = Field(default_factory=ResponsesSettings)
    """The Responses API's store."""
    images: ImageSettings = Field(default_factory=ImageSettings)
    """Images in chat: bounds and fetching."""
    api_keys: ApiKeySettings = Field(default_factory=ApiKeySettings)
    """API keys of the OpenAI endpoint."""
    http: HttpLimitSettings = Field(default_factory=HttpLimitSettings)
    """Limits on requests and connections."""
