"""The API key file: each key with a name, a priority class and limits (docs/security.md,
"API keys").

Two forms. The first, kept for existing deployments, is one key per line (blank lines and
``#`` comments ignored): every key is then unlimited, in the default class, named
``key-N`` by its line. The second is a YAML mapping, validated by :class:`KeyFile`, whose
errors name the file, the line and the field::

    classes:
      interactive: {weight: 8}
      batch: {weight: 1}
    keys:
      - name: alice
        key: sk-alice-...          # or sha256: <hex digest of the key>
        class: interactive
        limits: {requests_per_minute: 60, tokens_per_minute: 100000,
                 concurrent_requests: 4, max_context: 8192}
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.error import MarkedYAMLError, YAMLError

DEFAULT_CLASS = "default"
"""The class of a key that names none, and of every key of a one-key-per-line file."""

MAX_BYTES = 4 << 20
"""A key file larger than this is refused (it is read again on every change)."""


class KeyFileError(ValueError):
    """An unusable key file: every problem as ``FILE:LINE field: message``."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class Limits(_Model):
    """What one key may use; an unset limit is no limit."""

    requests_per_minute: int | None = Field(default=None, ge=1)
    """Requests started per minute (a token bucket of this size refilled evenly over a
    minute, as OpenAI counts them); beyond it, 429 with ``Retry-After``."""
    tokens_per_minute: int | None = Field(default=None, ge=1)
    """Prompt plus completion tokens per minute, counted as they are used; a request is
    refused with 429 while the key's bucket is empty."""
    concurrent_requests: int | None = Field(default=None, ge=1)
    """Requests of this key in flight at once (streams until their last chunk); one more
    is a 429."""
    max_context: int | None = Field(default=None, ge=1)
    """Prompt tokens plus ``max_tokens`` a request may ask for; more is a 400
    ``context_length_exceeded``."""


class PriorityClass(_Model):
    """A priority class: its share of the workers under overload."""

    weight: float = Field(default=1.0, gt=0, le=1000)
    """Its share relative to the other classes with requests waiting: a class of weight 8
    is served 8 requests for every 1 of a class of weight 1 while both wait."""
    headroom: float = Field(default=0.0, ge=0, le=0.9)
    """The last fraction of each worker's busy threshold (the router's ``busy_kv_usage``
    and ``busy_waiting``) that this class's requests may not fill, kept for the classes
    with less: with ``batch: {headroom: 0.1}`` and ``busy_kv_usage: 0.8``, a batch
    request finds a worker busy when its prompt's blocks would take its KV usage past
    72 %, so an interactive request (headroom 0) still finds room at once while the batch
    key saturates the deployment."""
    priority: int = Field(default=0, ge=-1000, le=1000)
    """Carried to the worker with each request of the class: an engine started with
    priority scheduling (a pool's ``priority_scheduling``) admits the waiting requests
    of a higher value first (vLLM's and SGLang's priority schedulers, the mocker's), so
    that an interactive request reaching a worker does not queue behind batch prefills
    there."""


class KeyEntry(_Model):
    """One API key: who it is, its class and its limits."""

    name: str = Field(pattern=r"^[A-Za-z0-9_.@-]{1,64}$")
    """The key's identity: what logs and ``/metrics`` show (never the key itself)."""
    key: str | None = Field(default=None, pattern=r"^\S+$")
    """The key a client sends (``Authorization: Bearer KEY``); or give ``sha256``."""
    sha256: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")
    """The key's SHA-256 digest in hex, so the file need not hold the key itself."""
    class_: str = Field(default=DEFAULT_CLASS, alias="class")
    """The priority class of its requests (one of ``classes``, or ``default``)."""
    allowed_classes: list[str] = Field(default_factory=list)
    """Other classes a request of this key may ask for with the ``x-dynamoctl-class``
    header (a batch job sent with an interactive key, say); any other is a 400."""
    limits: Limits = Field(default_factory=Limits)
    """Its rate, concurrency and context limits."""

    @model_validator(mode="after")
    def _one_secret(self) -> KeyEntry:
        if (self.key is None) == (self.sha256 is None):
            raise ValueError("give exactly one of 'key' and 'sha256'")
        return self

    def digest(self) -> bytes:
        if self.sha256 is not None:
            return bytes.fromhex(self.sha256)
        assert self.key is not None
        return hashlib.sha256(self.key.encode()).digest()


class KeyFile(_Model):
    """The key file's YAML form."""

    classes: dict[str, PriorityClass] = Field(default_factory=dict)
    """Priority classes by name; ``default`` (weight 1) exists unless redefined."""
    keys: list[KeyEntry] = Field(min_length=1)
    """The keys; names and keys unique."""

    def class_weights(self) -> dict[str, float]:
        return {DEFAULT_CLASS: 1.0} | {name: c.weight for name, c in self.classes.items()}

    def class_headrooms(self) -> dict[str, float]:
        return {DEFAULT_CLASS: 0.0} | {name: c.headroom for name, c in self.classes.items()}

    def class_priorities(self) -> dict[str, int]:
        return {DEFAULT_CLASS: 0} | {name: c.priority for name, c in self.classes.items()}


def load_key_file(path: str | Path) -> KeyFile:
    """Read ``path`` in either form; raise :class:`KeyFileError` if it is unusable."""
    try:
        with open(path, "rb") as file:
            data = file.read(MAX_BYTES + 1)
        if len(data) > MAX_BYTES:
            raise KeyFileError(f"{path}: larger than {MAX_BYTES} bytes")
        text = data.decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise KeyFileError(f"API key file {path}: {exc}") from None
    return parse_key_file(text, str(path))


def parse_key_file(text: str, filename: str) -> KeyFile:
    try:
        document = YAML(typ="rt").load(text)
    except (MarkedYAMLError, YAMLError):
        document = None  # a key with YAML's punctuation: the line form
    if not isinstance(document, CommentedMap):
        return _lines(text, filename)
    try:
        keyfile = KeyFile.model_validate(document)
    except ValidationError as exc:
        raise KeyFileError("\n".join(_issue(e, document, filename) for e in exc.errors())) from None
    problems = [
        _located(("keys", index, field), message, document, filename)
        for index, field, message in _conflicts(keyfile)
    ]
    if problems:
        raise KeyFileError("\n".join(problems))
    return keyfile


def _conflicts(keyfile: KeyFile) -> list[tuple[int, str, str]]:
    """(index, field, message) of each key that repeats another's name or key, or names
    a class that does not exist."""
    found: list[tuple[int, str, str]] = []
    names: dict[str, int] = {}
    digests: dict[bytes, int] = {}
    weights = keyfile.class_weights()
    for index, entry in enumerate(keyfile.keys):
        if entry.name in names:
            found.append((index, "name", f"'{entry.name}' is also keys[{names[entry.name]}]'s"))
        names.setdefault(entry.name, index)
        secret = "key" if entry.key is not None else "sha256"
        if (first := digests.setdefault(entry.digest(), index)) != index:
            found.append((index, secret, f"the same key as keys[{first}]"))
        for field, wanted in [("class", entry.class_)] + [
            ("allowed_classes", c) for c in entry.allowed_classes
        ]:
            if wanted not in weights:
                known = ", ".join(sorted(weights))
                found.append((index, field, f"class '{wanted}' is not one of: {known}"))
    return found


def _lines(text: str, filename: str) -> KeyFile:
    # Built without validation: these files predate the YAML form's rules on keys.
    keys = [
        KeyEntry.model_construct(name=f"key-{number}", key=line.strip())
        for number, line in enumerate(text.splitlines(), start=1)
        if line.strip()[:1] not in ("", "#")
    ]
    if not keys:
        raise KeyFileError(f"API key file {filename} holds no key")
    return KeyFile.model_construct(classes={}, keys=keys)


def _issue(error: Any, document: CommentedMap, filename: str) -> str:
    loc = tuple(part for part in error["loc"] if part not in ("function-after",))
    return _located(loc, error["msg"].removeprefix("Value error, "), document, filename)


def _located(loc: tuple[Any, ...], message: str, document: CommentedMap, filename: str) -> str:
    node: Any = document
    line = (document.lc.line or 0) + 1
    for part in loc:
        if isinstance(node, CommentedMap) and part in node:
            line = node.lc.key(part)[0] + 1
        elif isinstance(node, CommentedSeq) and isinstance(part, int) and part < len(node):
            line = node.lc.item(part)[0] + 1
        else:
            break
        node = node[part]
    field = ".".join(str(p) for p in loc) or "(file)"
    return f"{filename}:{line} {field}: {message}"
