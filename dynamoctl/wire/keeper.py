"""What a keeper tells each lifeline attached to its unix socket (docs/architecture.md,
"Keepers and lifelines").

A connection to the socket *is* a lifeline: while one is open the instance is not an
orphan. The keeper sends a :class:`KeeperHeader` first, then :class:`KeeperOutput` chunks
(only where the keeper relays its command's output: over SSH), and a :class:`KeeperExit`
when the command ended. Frames are a 4-byte big-endian length and a msgpack array.
"""

from __future__ import annotations

import asyncio
import socket
import struct

import msgspec

MAX_FRAME = 1 << 20
"""Largest frame accepted: an output chunk is at most 64 KiB."""
_LENGTH = struct.Struct(">I")


class KeeperHeader(msgspec.Struct, tag="header", array_like=True, frozen=True):
    """Who the lifeline is attached to: what a :class:`ProcessRecord` needs."""

    pid: int
    """The keeper's pid: the process group leader."""
    pgid: int
    host: str
    """``socket.gethostname()`` where the keeper runs."""
    socket: str = ""
    """Path of its lifeline socket on ``host`` (empty: none; not adoptable)."""


class KeeperOutput(msgspec.Struct, tag="output", array_like=True, frozen=True):
    """A chunk of the command's output (stdout and stderr merged)."""

    data: bytes


class KeeperExit(msgspec.Struct, tag="exit", array_like=True, frozen=True):
    """The command ended: the keeper's exit status (128 + N when killed by signal N)."""

    status: int


KeeperMessage = KeeperHeader | KeeperOutput | KeeperExit
_decoder = msgspec.msgpack.Decoder(KeeperMessage)


def encode_frame(message: KeeperMessage) -> bytes:
    body = msgspec.msgpack.encode(message)
    return _LENGTH.pack(len(body)) + body


def _decode(body: bytes) -> KeeperMessage:
    message: KeeperMessage = _decoder.decode(body)
    return message


def _length(prefix: bytes) -> int:
    (size,) = _LENGTH.unpack(prefix)
    if size > MAX_FRAME:
        raise msgspec.DecodeError(f"keeper frame of {size} bytes (at most {MAX_FRAME})")
    return int(size)


def _recv_exactly(sock: socket.socket, size: int) -> bytes | None:
    chunks, left = [], size
    while left:
        chunk = sock.recv(left)
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def recv_frame(sock: socket.socket) -> KeeperMessage | None:
    """The next message on a blocking socket; None at end of stream."""
    prefix = _recv_exactly(sock, _LENGTH.size)
    body = None if prefix is None else _recv_exactly(sock, _length(prefix))
    return None if body is None else _decode(body)


async def read_frame(reader: asyncio.StreamReader) -> KeeperMessage | None:
    """The next message on a stream; None at end of stream (or a cut frame)."""
    try:
        prefix = await reader.readexactly(_LENGTH.size)
        body = await reader.readexactly(_length(prefix))
    except asyncio.IncompleteReadError:
        return None
    return _decode(body)
