"""The mocker's structured answers: output that satisfies the request's constraint, a
tool call in the model's format, thinking before the answer (docs/mocker.md, "Structured
outputs, tools and reasoning").

The answer's text is decided when the request arrives, tokenised with the model's
tokenizer and handed to the scheduler as the request's script: its tokens then come out
one per decode step like any others, so timing, KV blocks and ``max_tokens`` behave as
for free text (an answer cut by ``max_tokens`` is cut, as a model's would be). The script
ends with end-of-sequence when the answer is complete.
"""

from __future__ import annotations

import json
import random

from dynamoctl.engines.api import GenerateRequest, RequestRejected
from dynamoctl.parsers import REASONING_PARSERS, TOOL_PARSERS
from dynamoctl.structured.instances import WORDS, Unsupported, example_text, json_instance
from dynamoctl.tokenizer import Tokenizer, load_tokenizer
from dynamoctl.wire.structured import OutputSpec


def answer_text(spec: OutputSpec, rng: random.Random) -> tuple[str, bool]:
    """The answer ``spec`` asks for, and whether it is complete (end-of-sequence follows);
    incomplete: thinking only, free text follows."""
    text = ""
    if spec.reasoning_format is not None:
        thought = " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 12)))
        text = REASONING_PARSERS[spec.reasoning_format]().write(f"Let me think: {thought}.")
    if spec.constraint is not None:
        return text + example_text(spec.constraint, rng), True
    if spec.tools and spec.tool_format is not None:
        tool = rng.choice(spec.tools)
        arguments = json.dumps(json_instance(tool.parameters, rng), ensure_ascii=False)
        return text + TOOL_PARSERS[spec.tool_format]().write(tool.name, arguments), True
    return text, False


class Scripts:
    """Scripts of structured requests, in token ids of the model's tokenizer (loaded on
    the first such request)."""

    def __init__(self, tokenizer_source: str) -> None:
        self.source = tokenizer_source
        self._tokenizer: Tokenizer | None = None

    def script(self, request: GenerateRequest, seed: int) -> list[int] | None:
        """``request``'s script, or None for free text; :class:`RequestRejected` for a
        constraint the mocker cannot answer (the frontend refuses those first)."""
        spec = request.output
        if spec is None:
            return None
        try:
            text, complete = answer_text(spec, random.Random(seed))
        except Unsupported as exc:
            raise RequestRejected(f"the mocker cannot answer this request: {exc}") from None
        if self._tokenizer is None:
            self._tokenizer = load_tokenizer(self.source)
        ids = self._tokenizer.encode(text, add_special_tokens=False)
        if complete and request.stop_token_ids and not request.ignore_eos:
            ids.append(min(request.stop_token_ids))
        return ids
