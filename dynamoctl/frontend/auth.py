"""API keys of the OpenAI endpoint: ``Authorization: Bearer KEY`` (or ``x-api-key: KEY``,
as Anthropic's clients send it) against every configured key, in constant time; the
probes' paths stay open.

Keys are kept only as SHA-256 digests: the comparison is then of equal-length strings
(``hmac.compare_digest`` leaks lengths), and a memory dump holds no key. Nothing here
logs, and the 401 never echoes what the client sent.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable

from dynamoctl.frontend.errors import OpenAIError, invalid_api_key

OPEN_PATHS = frozenset({"/health", "/live", "/metrics"})
"""Served without a key: liveness, readiness and Prometheus scrapes."""


class ApiKeys:
    def __init__(self, keys: Iterable[str]) -> None:
        self._digests = [hashlib.sha256(key.encode()).digest() for key in keys]
        if not self._digests:
            raise ValueError("API keys are configured, but none was found")

    def check(self, path: str, headers: Iterable[tuple[bytes, bytes]]) -> OpenAIError | None:
        """None if the request may go on; else the 401 to answer."""
        if path in OPEN_PATHS:
            return None
        token = b""
        for name, value in headers:
            if name == b"authorization":
                scheme, _, token = value.strip().partition(b" ")
                if scheme.lower() != b"bearer":
                    token = b""
                break
            if name == b"x-api-key":  # Anthropic's clients
                token = value
                break
        token = token.strip()
        if not token:
            return invalid_api_key(
                "You didn't provide an API key. Send it as 'Authorization: Bearer KEY' "
                "(or 'x-api-key: KEY')."
            )
        digest = hashlib.sha256(token).digest()
        match = False
        for key in self._digests:  # every key, whatever matched: no timing of which
            match |= hmac.compare_digest(digest, key)
        return None if match else invalid_api_key("Incorrect API key provided.")
