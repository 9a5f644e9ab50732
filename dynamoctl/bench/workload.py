"""What the load generator sends: sessions of turns, synthetic or from a trace.

A *session* is a conversation: a prefix shared with other sessions (a system prompt),
then turns, each adding new user tokens to the whole history so far. Single-request
workloads are one-turn sessions. Prompts are token ids (exact lengths; ours and vLLM's
``/v1/completions`` accept them) or text built from common English words (about one token
each in BPE vocabularies) for chat endpoints and servers that refuse ids. Everything is
seeded, so two runs with the same arguments send the same prompts; each load level of a
sweep gets its own sessions (only the shared prefixes are common to all levels), so a level
never finds the previous level's prompts in the server's prefix cache.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import msgspec

Api = Literal["completions", "chat"]
TOKEN_LO, TOKEN_HI = 1000, 8000
"""Token ids used in prompts: inside every common vocabulary, past special tokens."""

_WORD_TEXT = (
    "the of and to in is that for it as was with be by on not he this are or his from at "
    "which but have an they you were her she there one all we their has been would when "
    "will more no if out so said what up its about into than them can only other new some "
    "time could these two may then do first any my now such like our over man me even most "
    "made after also did many before must through back years where much your way well down "
    "should because each just those people how too little state good very make world still "
    "own see men work long get here between both life being under never day same another "
    "know while last might us great old year off come since against go came right used take"
)
_WORDS = _WORD_TEXT.split()


class LengthDist(msgspec.Struct, frozen=True):
    """A distribution of token counts: ``512``, ``uniform:A:B``, ``normal:MEAN:STD``,
    ``exponential:MEAN``; samples are at least 1."""

    kind: Literal["fixed", "uniform", "normal", "exponential"]
    a: float
    b: float = 0.0

    @classmethod
    def parse(cls, text: str) -> LengthDist:
        kind, _, rest = text.partition(":")
        try:
            if not rest:
                return cls("fixed", float(int(kind)))
            args = [float(x) for x in rest.split(":")]
            if kind == "uniform" and len(args) == 2 and 1 <= args[0] <= args[1]:
                return cls("uniform", args[0], args[1])
            if kind == "normal" and len(args) == 2 and args[0] >= 1 and args[1] >= 0:
                return cls("normal", args[0], args[1])
            if kind == "exponential" and len(args) == 1 and args[0] >= 1:
                return cls("exponential", args[0])
        except ValueError:
            pass
        raise ValueError(
            f"bad length {text!r}: use N, uniform:MIN:MAX, normal:MEAN:STD or exponential:MEAN"
        )

    def sample(self, rng: random.Random) -> int:
        if self.kind == "fixed":
            value = self.a
        elif self.kind == "uniform":
            value = rng.randint(int(self.a), int(self.b))
        elif self.kind == "normal":
            value = rng.gauss(self.a, self.b)
        else:
            value = rng.expovariate(1.0 / self.a)
        return max(1, round(value))

    @property
    def mean(self) -> float:
        return (self.a + self.b) / 2 if self.kind == "uniform" else self.a


class Turn(msgspec.Struct, frozen=True):
    new_tokens: list[int]
    """User tokens this turn adds after the history."""
    max_tokens: int


class Session(msgspec.Struct, frozen=True):
    id: int
    prefix: list[int]
    """Shared with other sessions of the same prefix group (a system prompt)."""
    turns: list[Turn]
    arrival: float | None = None
    """Seconds after the run's start (open loop and traces); None: as soon as a slot frees."""


def random_tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(TOKEN_LO, TOKEN_HI) for _ in range(n)]


def to_text(tokens: list[int]) -> str:
    return " ".join(_WORDS[t % len(_WORDS)] for t in tokens)


def synthetic_sessions(
    isl: LengthDist,
    osl: LengthDist,
    *,
    turns: int = 1,
    shared_prefix: int = 0,
    prefix_groups: int = 1,
    seed: int = 0,
    level: int = 0,
) -> Iterator[Session]:
    """Endless sessions: the ``shared_prefix`` tokens of the session's group (one of
    ``prefix_groups``), then ``turns`` turns of ``isl`` new tokens each after the history.

    Each ``level`` (a sweep's load level) draws different turns from the same ``seed``:
    replaying one level's prompts at the next would turn into prefix-cache hits the
    workload does not have. The prefix groups depend on ``seed`` only: sharing them is
    what ``shared_prefix`` asks for, across levels too."""
    rng = random.Random(seed if level == 0 else f"{seed}/level/{level}")  # level 0: as before
    groups = [random_tokens(random.Random(f"{seed}/prefix/{g}"), shared_prefix)
              for g in range(max(1, prefix_groups))]  # fmt: skip
    index = 0
    while True:
        prefix = groups[index % len(groups)]
        session_turns = []
        for _ in range(turns):
            session_turns.append(Turn(random_tokens(rng, isl.sample(rng)), osl.sample(rng)))
        yield Session(index, prefix, session_turns)
        index += 1


def poisson_arrivals(sessions: Iterator[Session], rate: float, seed: int = 0) -> Iterator[Session]:
    """Give sessions exponential gaps: a Poisson process of ``rate`` sessions per second."""
    rng = random.Random(f"{seed}/arrivals")
    t = 0.0
    for session in sessions:
        t += rng.expovariate(rate)
        yield msgspec.structs.replace(session, arrival=t)


class TraceEntry(msgspec.Struct, frozen=True):
    """One line of a Mooncake-style trace."""

    timestamp: float
    """Arrival, milliseconds (from any origin)."""
    input_length: int
    output_length: int
    hash_ids: list[int] = []
    """Prompt blocks: equal ids are equal token blocks, so prefixes repeat as in the trace."""


def read_trace(path: str | Path) -> list[TraceEntry]:
    entries = []
    decoder = msgspec.json.Decoder(TraceEntry)
    for n, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if line.strip():
            try:
                entries.append(decoder.decode(line))
            except msgspec.DecodeError as exc:
                raise ValueError(f"{path}:{n}: {exc}") from exc
    if not entries:
        raise ValueError(f"{path}: no trace entries")
    return entries


@functools.lru_cache(maxsize=8192)
def _block(hash_id: int, size: int) -> tuple[int, ...]:
    return tuple(random_tokens(random.Random(hash_id * 1_000_003 + size), size))


def trace_sessions(
    entries: list[TraceEntry], speedup: float = 1.0, block_size: int = 512
) -> Iterator[Session]:
    """One single-turn session per entry, arriving at ``(timestamp - first) / speedup``."""
    origin = min(e.timestamp for e in entries)
    for i, entry in enumerate(sorted(entries, key=lambda e: e.timestamp)):
        tokens = [t for h in entry.hash_ids for t in _block(h, block_size)][: entry.input_length]
        if len(tokens) < entry.input_length:  # the trace's blocks do not cover the prompt
            tokens += random_tokens(random.Random(f"trace/{i}"), entry.input_length - len(tokens))
        arrival = (entry.timestamp - origin) / 1000.0 / speedup
        yield Session(i, [], [Turn(tokens, max(1, entry.output_length))], arrival)


class Conversation:
    """A session being played: builds each turn's request body from the history."""

    def __init__(self, session: Session, api: Api, text: bool) -> None:
        self.session = session
        self.api = api
        self.text = text or api == "chat"
        self.turn = 0
        self._history: list[int] = list(session.prefix)
        self._messages: list[dict[str, str]] = []
        if session.prefix and self.text:
            self._messages.append({"role": "system", "content": to_text(session.prefix)})

    @property
    def done(self) -> bool:
        return self.turn >= len(self.session.turns)

    def body(self, model: str, extra: dict[str, Any], ignore_eos: bool) -> dict[str, Any]:
        """The JSON body of the current turn (streamed, with usage in the last chunk)."""
        turn = self.session.turns[self.turn]
        body: dict[str, Any] = {"model": model, "max_tokens": turn.max_tokens, "stream": True,
                                "stream_options": {"include_usage": True}}  # fmt: skip
        if ignore_eos:
            body["ignore_eos"] = True
        if self.api == "chat":
            user = {"role": "user", "content": to_text(turn.new_tokens)}
            body["messages"] = [*self._messages, user]
        elif self.text:
            body["prompt"] = "".join(m["content"] + " " for m in self._messages) + to_text(
                turn.new_tokens
            )
        else:
            body["prompt"] = self._history + turn.new_tokens
        body.update(extra)
        return body

    def prompt_length(self) -> int:
        """Tokens (or words) this turn's prompt has, as we built it."""
        return len(self._history) + len(self.session.turns[self.turn].new_tokens)

    def advance(self, reply: str, reply_tokens: int) -> None:
        """Add the current turn and its reply to the history (the real reply text in text
        mode, seeded stand-in tokens otherwise), then move to the next turn."""
        turn = self.session.turns[self.turn]
        stand_in = random_tokens(random.Random(f"{self.session.id}/{self.turn}"), reply_tokens)
        self._history += turn.new_tokens + stand_in
        if self.text:
            self._messages.append({"role": "user", "content": to_text(turn.new_tokens)})
            self._messages.append({"role": "assistant", "content": reply})
        self.turn += 1


def dumps_body(body: dict[str, Any]) -> bytes:
    return msgspec.json.encode(body)
