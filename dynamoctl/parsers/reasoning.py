"""Reasoning formats: a model that thinks before it answers writes its thinking between
tags; it is returned as ``reasoning_content``, apart from the answer (docs/api.md).
Names as vLLM's ``--reasoning-parser`` (built in, for the same reasons as the tool
parsers: :mod:`dynamoctl.parsers.tools`)."""

from __future__ import annotations

from typing import ClassVar

from dynamoctl.util.registry import Registry


class ReasoningParser:
    """Thinking between :attr:`START` and :attr:`END` at the start of the output."""

    START: ClassVar[str] = "<think>"
    END: ClassVar[str] = "</think>"
    STARTS_THINKING: ClassVar[bool]
    """Whether output without :attr:`START` is thinking from its first token (the chat
    template opened the block in the prompt), rather than all answer."""

    def split(self, text: str) -> tuple[str, str]:
        """``(reasoning, answer)`` of a whole output."""
        body = text.lstrip()
        opened = body.startswith(self.START)
        if not opened and not self.STARTS_THINKING:
            return "", text
        body = body.removeprefix(self.START) if opened else text
        reasoning, closed, answer = body.partition(self.END)
        if not closed:
            return reasoning, ""  # cut short while thinking
        return reasoning, answer.lstrip("\n")

    def write(self, thought: str) -> str:
        """Thinking as the model writes it before its answer (what the mocker emits)."""
        return f"{self.START}\n{thought}\n{self.END}\n\n"


REASONING_PARSERS: Registry[type[ReasoningParser]] = Registry("reasoning parser")
"""Reasoning formats by name (recipe ``model.reasoning_parser``)."""


@REASONING_PARSERS.register("deepseek_r1")
class DeepSeekR1Parser(ReasoningParser):
    """DeepSeek-R1: ``<think>`` is optional (its template puts it in the prompt); all of
    the output up to ``</think>`` is thinking."""

    STARTS_THINKING = True


@REASONING_PARSERS.register("qwen3")
class Qwen3Parser(ReasoningParser):
    """Qwen3: thinking only when the output opens ``<think>``; otherwise all answer
    (``enable_thinking: false``)."""

    STARTS_THINKING = False
