"""Standalone router messages: the ``route`` endpoint a frontend calls, and the bookings
stream router replicas share (docs/router.md, "Standalone router and replicas").

Only prompt token ids cross to the router, to match them against its KV index; generated
tokens never do: the frontend streams them from the worker the router named.

* ``route`` endpoint (request plane): the body is a :data:`RouteCall`. A
  :class:`RouteRequest` is answered with one chunk, a :data:`RouteAnswer`; a
  :class:`RouteNotify` is answered with no chunk (only End).
* Bookings stream (event plane, one publisher per replica): each payload is a
  :data:`BookingMessage` (a :class:`BookingChanges` carries the net changes of a few
  milliseconds in one message); a snapshot answer's payload is a :class:`BookingState`.

Tagged msgpack arrays, compatibility as in :mod:`dynamoctl.wire.planes`: append fields
at the end, with a default.
"""

from __future__ import annotations

from typing import Final, Literal, TypeAlias

import msgspec

from dynamoctl.wire.ids import TokenIds, dec_hook, enc_hook

RouteEventKind: TypeAlias = Literal["first_token", "finished"]
RoutePool: TypeAlias = Literal["default", "prefill", "decode"]
"""Which of a model's routers a pick uses (docs/architecture.md): ``default`` the agg and decode
workers, KV-aware (the whole request, or a local prefill); ``prefill`` the prefill
workers, KV-aware; ``decode`` the agg and decode workers with no overlap credit and no
prefill booked (the prompt's KV comes from a prefill worker)."""
BookingPool: TypeAlias = Literal["default", "prefill"]
"""Whose bookings: the agg and decode workers' router (``default`` and ``decode`` picks)
or the prefill workers'."""
RefusalReason: TypeAlias = Literal["no_workers", "busy", "unknown_model"]


class _Tagged(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag_field="t"):
    """Base of the tagged router messages."""


# --------------------------------------------------------------------------- route calls


class RouteRequest(_Tagged, tag=1):
    """Where should this prompt go? Books the request's load on the chosen worker."""

    model: str
    request_id: str
    """The frontend's id; the booking is released by :class:`RouteEvent` under it."""
    token_ids: TokenIds
    """The prompt (plus tokens generated so far, when a stream migrates), packed
    (:mod:`dynamoctl.wire.ids`)."""
    exclude: list[str] = []
    """Workers not to use (they failed this request already)."""
    pool: RoutePool = "default"
    headroom: float = 0.0
    """The last fraction of each busy threshold the request's priority class may not fill."""


class RouteEvent(msgspec.Struct, array_like=True, gc=False):
    """A booked request's progress: ``first_token`` releases its prefill tokens,
    ``finished`` everything it booked."""

    model: str
    request_id: str
    kind: RouteEventKind
    pool: BookingPool = "default"


class RouteNotify(_Tagged, tag=2):
    """Progress of requests this replica booked, batched; answered with End only."""

    events: list[RouteEvent]


class RouteReply(_Tagged, tag=16):
    """The chosen worker."""

    worker_id: str
    address: str
    """Request-plane address of the worker (from its discovery record)."""
    overlap_blocks: int
    """Leading prompt blocks the router believes cached there."""
    prompt_blocks: int = 0
    """Full blocks in the prompt."""
    disaggregated: bool = False
    """The model has prefill or decode workers (the frontend then decides, per request,
    where its prompt is prefilled)."""
    prefill_workers: int = 0
    """Prefill workers alive."""
    decode_cached_tokens: int = 0
    """Most leading prompt tokens cached on one agg or decode worker (a ``default`` pick
    of a disaggregated model; else 0): what a local prefill would not compute."""
    label: str = ""
    """The worker's name in ``dynamoctl status`` (``agg-1``), for logs; empty outside a
    supervised deployment."""


class RouteRefused(_Tagged, tag=17):
    """No worker can take the request: ``busy`` means waiting may help (the frontend
    queues, then answers 503); the others are a 503 at once."""

    reason: RefusalReason
    message: str


RouteCall: TypeAlias = RouteRequest | RouteNotify
RouteAnswer: TypeAlias = RouteReply | RouteRefused


# --------------------------------------------------------------------------- bookings stream


class Booked(_Tagged, tag=32):
    """A replica booked ``request_id`` on ``worker_id`` (a re-booking replaces it)."""

    model: str
    request_id: str
    worker_id: str
    prefill_tokens: int
    """Uncached prompt tokens, released at the first token (0 once it came)."""
    hashes: list[int]
    """Sequence hashes of the prompt's full blocks, held until the request finishes."""
    pool: BookingPool = "default"


class Released(_Tagged, tag=33):
    """A replica released (part of) a booking: ``first_token`` or ``finished``."""

    model: str
    request_id: str
    kind: RouteEventKind
    pool: BookingPool = "default"


class BookingState(_Tagged, tag=34):
    """Snapshot payload: every booking the replica holds now."""

    bookings: list[Booked]


class BookingChanges(_Tagged, tag=35):
    """Several bookings' changes in one message, applied in order: what a replica booked
    and released since its last message (one per request at most, net of what it
    booked and released in between)."""

    changes: list[Booked | Released]


BookingMessage: TypeAlias = Booked | Released | BookingState | BookingChanges

_encoder: Final = msgspec.msgpack.Encoder(enc_hook=enc_hook)
_call_decoder: Final[msgspec.msgpack.Decoder[RouteCall]] = msgspec.msgpack.Decoder(
    RouteCall, dec_hook=dec_hook
)
_answer_decoder: Final[msgspec.msgpack.Decoder[RouteAnswer]] = msgspec.msgpack.Decoder(RouteAnswer)
_booking_decoder: Final[msgspec.msgpack.Decoder[BookingMessage]] = msgspec.msgpack.Decoder(
    BookingMessage
)


def encode(message: RouteCall | RouteAnswer | BookingMessage) -> bytes:
    return _encoder.encode(message)


def decode_call(payload: bytes) -> RouteCall:
    return _call_decoder.decode(payload)


def decode_answer(payload: bytes) -> RouteAnswer:
    return _answer_decoder.decode(payload)


def decode_booking(payload: bytes) -> BookingMessage:
    return _booking_decoder.decode(payload)
