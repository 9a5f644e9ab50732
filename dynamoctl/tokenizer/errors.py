"""Errors of the tokenizer package. Each message names the file or setting to fix."""

from __future__ import annotations


class TokenizerError(Exception):
    """A tokenizer cannot be loaded or used as asked."""


class TokenizerNotFound(TokenizerError):
    """The tokenizer source is not the builtin one nor a local directory with tokenizer.json."""


class ChatTemplateError(TokenizerError):
    """The model has no chat template, or its template rejected (or failed on) a conversation.

    Raised for request data as much as for broken templates, so the frontend answers it as a
    client error (HTTP 400), with this message.
    """
