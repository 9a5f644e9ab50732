"""The mocker's gang channel: what a simulated multi-node engine's members say to each
other (docs/mocker.md, "Multi-node replicas").

The leader binds a ZeroMQ ROUTER on its rendezvous address; each follower connects a
DEALER, says :class:`Hello` until it gets :class:`Welcome`, then answers every
:class:`Step` with an :class:`Ack`: one round trip per simulated forward step, as a
collective would be, so a follower that dies or stops stalls the leader's steps.
"""

from __future__ import annotations

import msgspec


class Hello(msgspec.Struct, frozen=True, tag=True):
    """A follower asks to join: its node rank and the gang size it was told."""

    rank: int
    nnodes: int


class Welcome(msgspec.Struct, frozen=True, tag=True):
    """The leader took the follower into its gang."""


class Step(msgspec.Struct, frozen=True, tag=True):
    """The leader runs forward step ``seq``: every follower must answer it."""

    seq: int


class Ack(msgspec.Struct, frozen=True, tag=True):
    """Follower ``rank`` has done step ``seq``."""

    seq: int
    rank: int


GangMessage = Hello | Welcome | Step | Ack
ENCODER = msgspec.msgpack.Encoder()
DECODER = msgspec.msgpack.Decoder(GangMessage)
