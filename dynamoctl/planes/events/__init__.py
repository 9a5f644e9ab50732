"""The event plane: sequenced PUB/SUB streams with replay, wire-compatible with vLLM.

Frames (vLLM's ``ZmqEventPublisher``; helpers in :mod:`dynamoctl.wire`):

* PUB: ``[topic, seq, payload]``; ``seq`` is 8-byte big-endian unsigned, from 0 per stream.
* Replay (ROUTER on the publisher): the subscriber's DEALER sends ``[b"", start]``
  (``start`` 8-byte BE, the empty frame mimics REQ). The publisher answers one message per
  buffered entry with ``seq >= start``: ``[b"", seq, payload]``; then ``[b"", END, b""]``
  with ``END`` = -1 as signed 8-byte BE (an empty payload also marks the end).

Our extension, **snapshot replay**: a publisher given a ``snapshot`` provider answers a
request that starts before its oldest buffered entry (or past its next seq: it restarted)
with ``[b"", seq, state, b"snapshot"]`` first (``seq`` signed, -1 = before any event), then
the buffered entries after ``seq``, then END. A plain vLLM subscriber never triggers it
unless its buffer was outrun; ours turns it into a :class:`Snapshot` item. Without a
provider the publisher behaves exactly like vLLM's, and a gap it cannot fill becomes a
:class:`Lost` item on our side.

The subscriber detects gaps (seq jumps), late joins (first seq > 0), lost trailing
messages (an idle poll of the replay socket) and publisher restarts; see
:mod:`dynamoctl.planes.events.tracker` for the rules and docs/planes.md for the knobs.
"""

from dynamoctl.planes.events.publisher import EventPublisher, SnapshotProvider
from dynamoctl.planes.events.subscriber import EventSubscriber, SourceStats
from dynamoctl.planes.events.tracker import Event, Item, Lost, Snapshot, StreamTracker

__all__ = [
    "Event",
    "EventPublisher",
    "EventSubscriber",
    "Item",
    "Lost",
    "Snapshot",
    "SnapshotProvider",
    "SourceStats",
    "StreamTracker",
]
