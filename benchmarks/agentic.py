"""The long-context multi-turn (agentic) load of benchmarks/dynamo_compare.py.

Each client runs conversations one after another: a conversation starts from a history of
``history_tokens`` tokens (a user message of text of its own, so no two conversations
share a prefix) and lasts ``turns`` turns; every turn resends the whole history plus
``turn_tokens`` tokens of new user text as a streamed chat completion asking for
``answer_tokens`` tokens (``ignore_eos``), and the next turn appends a stand-in for the
answer (text of ``answer_tokens`` tokens; the client does not parse the stream) and the
new user text. This is what agents do: most of every request is text the frontend saw in
the previous turn, which is what a tokenisation prefix cache saves.

Token counts are for the builtin tokenizer both systems serve (its ``tokenizer.json``),
measured once on the word list below.
"""

from __future__ import annotations

import json
import random
from importlib import resources
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tokenizers import Tokenizer

WORDS = " ".join([
    "the agent reads a file then calls a tool and waits for its output before it writes",
    "code tests logs a diff plan step result error retry context window history model",
    "request stream token cache prefix router worker frontend answer question patch",
]).split()  # fmt: skip


def builtin_tokenizer() -> Tokenizer:
    """The builtin tokenizer both benchmark systems serve (its ``tokenizer.json``)."""
    from tokenizers import Tokenizer

    builtin = resources.files("dynamoctl.tokenizer").joinpath("builtin")
    return Tokenizer.from_str(builtin.joinpath("tokenizer.json").read_text())


def tokens_per_word() -> float:
    """The builtin tokenizer's tokens per word of :data:`WORDS` text."""
    tokenizer = builtin_tokenizer()
    rng = random.Random(0)
    sample = " ".join(rng.choice(WORDS) for _ in range(20_000))
    return len(tokenizer.encode(sample).ids) / 20_000


class Conversation:
    """One conversation's messages, grown turn by turn."""

    def __init__(
        self, seed: int, ratio: float, history: int, turn: int, answer: int, model: str
    ) -> None:
        self.rng = random.Random(seed)
        self.ratio = ratio
        self.turn, self.answer, self.model = turn, answer, model
        self.messages = [{"role": "user", "content": f"conversation {seed}: " + self.text(history)}]

    def text(self, tokens: int) -> str:
        return " ".join(self.rng.choice(WORDS) for _ in range(max(1, round(tokens / self.ratio))))

    def next_turn(self) -> bytes:
        """The next request's body: the history plus new user text."""
        if len(self.messages) > 1:
            self.messages.append({"role": "assistant", "content": self.text(self.answer)})
        self.messages.append({"role": "user", "content": self.text(self.turn)})
        body = {"model": self.model, "messages": self.messages, "max_tokens": self.answer,
                "stream": True, "ignore_eos": True}  # fmt: skip
        return json.dumps(body).encode()
