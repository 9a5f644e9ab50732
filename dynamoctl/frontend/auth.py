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
from dynamoctl.settings.keyfile import KeyEntry

OPEN_PATHS = frozenset({"/health", "/live", "/metrics"})
"""Served without a key: liveness, readiness and Prometheus scrapes."""


class ApiKeys:
    """The keys of one reading of the key file, each with its entry (name, class, limits)."""

    def __init__(self, keys: Iterable[str | KeyEntry]) -> None:
        entries = [KeyEntry.model_construct(name="key", key=k) if isinstance(k, str) else k
                   for k in keys]  # fmt: skip
        self._keys = [(entry.digest(), entry) for entry in entries]
        if not self._keys:
            raise ValueError("API keys are configured, but none was found")

    def check(self, path: str, headers: Iterable[tuple[bytes, bytes]]) -> OpenAIError | None:
        """None if the request may go on; else the 401 to answer."""
        if path in OPEN_PATHS:
            return None
        found = self.identify(headers)
        return found if isinstance(found, OpenAIError) else None

    def identify(self, headers: Iterable[tuple[bytes, bytes]]) -> KeyEntry | OpenAIError:
        """The entry of the key the request carries; else the 401 to answer."""
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
        found: KeyEntry | None = None
        for key, entry in self._keys:  # every key, whatever matched: no timing of which
            equal = hmac.compare_digest(digest, key)
            found = (found, entry)[equal]
        return found if found is not None else invalid_api_key("Incorrect API key provided.")
