"""The one error of structured outputs, tools and reasoning: a request refused, naming the
parameter at fault. The frontend answers it as an OpenAI 400 with that ``param``
(:func:`dynamoctl.frontend.body.decode_body` inside a request model's validator, and the
routes around :mod:`dynamoctl.structured.plan`); this package knows no HTTP."""

from __future__ import annotations


class StructuredError(ValueError):
    """A structured-output, tool-calling or reasoning request that cannot be served as
    asked; the words say why, ``param`` names the request parameter to change."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param
