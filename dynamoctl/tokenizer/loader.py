"""Load tokenizers from the package (``builtin``) or a local model directory; never download.

A model directory is read the way transformers reads it, for the fast-tokenizer format:

- ``tokenizer.json`` (required): the ``tokenizers`` pipeline and vocabulary;
- ``tokenizer_config.json``: ``bos_token``/``eos_token``/``unk_token``/``pad_token`` (text,
  or ``{"content": ...}``), ``chat_template`` (a string, or a list of ``{name, template}``)
  and ``added_tokens_decoder`` (tokens added if ``tokenizer.json`` lacks them);
- ``chat_template.jinja`` / ``chat_template.json``: a chat template that, as in
  transformers, takes priority over ``tokenizer_config.json``'s, and
  ``additional_chat_templates/<name>.jinja`` for named ones;
- ``generation_config.json``, else ``config.json``: ``eos_token_id`` (an id or a list).
"""

from __future__ import annotations

import json
import logging
import sys
import threading
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tokenizers import AddedToken
from tokenizers import Tokenizer as FastTokenizer

from dynamoctl.tokenizer.errors import TokenizerError, TokenizerNotFound
from dynamoctl.tokenizer.tokenizer import DEFAULT_TEMPLATE, Tokenizer

if TYPE_CHECKING:
    if sys.version_info >= (3, 11):
        from importlib.resources.abc import Traversable
    else:
        from importlib.abc import Traversable

log = logging.getLogger(__name__)

BUILTIN = "builtin"
"""The source naming the tokenizer shipped inside dynamoctl (``dynamoctl/tokenizer/builtin``).
A directory of that name is reached as ``./builtin``."""

SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "pad_token")
"""``tokenizer_config.json`` keys passed to chat templates under the same names."""

END_OF_TURN_TOKENS = ("<|eot_id|>", "<|eom_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>")
"""End-of-turn tokens of common chat formats (Llama 3, ChatML, Phi, Gemma). When one is a
special token of the model, it ends generation even if the config does not list it: a chat
model that writes it has finished its answer, and would otherwise go on to invent the
user's next turn."""

_cache: dict[str, Tokenizer] = {}
_cache_lock = threading.Lock()


def load_tokenizer(source: str) -> Tokenizer:
    """The tokenizer of ``source``: ``builtin`` or a local directory with ``tokenizer.json``.

    Loaded once per source and process, then cached (a directory is keyed by its resolved
    path; edit its files and restart to reload). Raises :class:`TokenizerNotFound` for
    anything else, notably a Hugging Face hub id: nothing is ever downloaded.
    """
    key, root = _resolve(source)
    # One lock for all sources: loads are rare (once per model) and this keeps two requests
    # for a new model from parsing a large tokenizer.json twice.
    with _cache_lock:
        tokenizer = _cache.get(key)
        if tokenizer is None:
            tokenizer = _load(key, root)
            _cache[key] = tokenizer
            log.info(
                "loaded tokenizer %s: %d tokens, eos ids %s, chat templates %s",
                key,
                tokenizer.vocab_size,
                sorted(tokenizer.eos_token_ids),
                sorted(tokenizer.chat_template_names) or "none",
            )
    return tokenizer


def clear_cache() -> None:
    """Forget loaded tokenizers (tests; a later load reads the files again)."""
    with _cache_lock:
        _cache.clear()


def _resolve(source: str) -> tuple[str, Traversable]:
    """Cache key and root of ``source``, or :class:`TokenizerNotFound`."""
    if source == BUILTIN:
        # importlib.resources, not __file__: works from wheels, zips and editable installs.
        return BUILTIN, resources.files("dynamoctl.tokenizer").joinpath("builtin")
    if not source.strip():
        raise TokenizerNotFound(
            "tokenizer source is empty: set model.tokenizer to a directory with tokenizer.json "
            f"(or to '{BUILTIN}' for the small tokenizer shipped with dynamoctl)"
        )
    path = Path(source).expanduser()
    if path.is_dir():
        resolved = path.resolve()
        return str(resolved), resolved
    if path.is_file():
        raise TokenizerNotFound(
            f"tokenizer source '{source}' is a file: point model.tokenizer at the directory "
            "that holds tokenizer.json"
        )
    raise TokenizerNotFound(
        f"tokenizer source '{source}' is not a local directory; dynamoctl never downloads: "
        "point model.tokenizer at a directory with tokenizer.json"
    )


def _load(source: str, root: Traversable) -> Tokenizer:
    text = _read(root, "tokenizer.json")
    if text is None:
        raise TokenizerNotFound(_missing_tokenizer_json(source, root))
    try:
        backend = FastTokenizer.from_str(text)
    except Exception as exc:  # tokenizers raises a bare Exception on a bad file
        raise TokenizerError(f"{source}/tokenizer.json is not a valid tokenizer: {exc}") from exc
    config = _read_json(root, "tokenizer_config.json", source) or {}
    _add_declared_tokens(backend, config.get("added_tokens_decoder"), source)
    special = {
        name: text for name in SPECIAL_TOKEN_NAMES if (text := _token_text(config.get(name)))
    }
    return Tokenizer(
        backend,
        source=source,
        special_tokens=special,
        eos_token_ids=_eos_token_ids(backend, special.get("eos_token"), root, source),
        chat_templates=_chat_templates(root, config, source),
    )


def _read(root: Traversable, name: str) -> str | None:
    child = root.joinpath(name)
    return child.read_text(encoding="utf-8") if child.is_file() else None


def _read_json(root: Traversable, name: str, source: str) -> dict[str, Any] | None:
    text = _read(root, name)
    if text is None:
        return None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TokenizerError(f"{source}/{name} is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise TokenizerError(f"{source}/{name} must hold a JSON object")
    return data


def _missing_tokenizer_json(source: str, root: Traversable) -> str:
    found = [n for n in ("tokenizer.model", "vocab.json") if root.joinpath(n).is_file()]
    hint = (
        f" (it has {found[0]}, a slow tokenizer: convert it once, where transformers is "
        "installed, with AutoTokenizer.from_pretrained(dir).save_pretrained(dir))"
        if found
        else ""
    )
    return f"tokenizer directory '{source}' has no tokenizer.json{hint}"


def _token_text(value: object) -> str | None:
    """Special token text from ``tokenizer_config.json``: ``"<s>"`` or ``{"content": "<s>"}``."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) and value else None


def _add_declared_tokens(backend: FastTokenizer, declared: object, source: str) -> None:
    """Add tokens that ``added_tokens_decoder`` declares and ``tokenizer.json`` lacks, as
    transformers does; their ids must come out as declared, or the model would see other
    ids than it was trained with."""
    if not isinstance(declared, dict):
        return
    for key, spec in sorted(declared.items(), key=lambda kv: int(kv[0])):
        content = spec.get("content") if isinstance(spec, dict) else None
        if not isinstance(content, str) or backend.token_to_id(content) is not None:
            continue
        special = bool(spec.get("special", False))
        token = AddedToken(
            content,
            single_word=bool(spec.get("single_word", False)),
            lstrip=bool(spec.get("lstrip", False)),
            rstrip=bool(spec.get("rstrip", False)),
            normalized=bool(spec.get("normalized", not special)),
            special=special,
        )
        if special:
            backend.add_special_tokens([token])
        else:
            backend.add_tokens([token])
        if backend.token_to_id(content) != int(key):
            raise TokenizerError(
                f"{source}/tokenizer_config.json declares token {content!r} with id {key}, "
                f"but tokenizer.json gives it id {backend.token_to_id(content)}: the two files "
                "come from different tokenizers; copy both from the model's own directory"
            )


def _eos_token_ids(
    backend: FastTokenizer, eos_token: str | None, root: Traversable, source: str
) -> set[int]:
    ids: set[int] = set()
    if eos_token is not None and (eos_id := backend.token_to_id(eos_token)) is not None:
        ids.add(eos_id)
    # generation_config.json is what generate() uses; config.json is its fallback there too.
    for name in ("generation_config.json", "config.json"):
        config = _read_json(root, name, source) or {}
        if "eos_token_id" in config:
            value = config["eos_token_id"]
            values = value if isinstance(value, list) else [value]
            ids.update(v for v in values if isinstance(v, int) and not isinstance(v, bool))
            break
    for token_id, token in backend.get_added_tokens_decoder().items():
        if token.special and token.content in END_OF_TURN_TOKENS:
            ids.add(token_id)
    return ids


def _chat_templates(root: Traversable, config: dict[str, Any], source: str) -> dict[str, str]:
    templates: dict[str, str] = {}
    value: object = config.get("chat_template")
    from_json = _read_json(root, "chat_template.json", source)
    if from_json is not None and "chat_template" in from_json:
        value = from_json["chat_template"]
    jinja = _read(root, "chat_template.jinja")
    if jinja is not None:
        value = jinja
    if isinstance(value, str):
        templates[DEFAULT_TEMPLATE] = value
    elif isinstance(value, list):
        for item in value:
            if not (
                isinstance(item, dict)
                and isinstance(item.get("name"), str)
                and isinstance(item.get("template"), str)
            ):
                raise TokenizerError(
                    f"{source}: chat_template list entries must be {{'name': ..., "
                    f"'template': ...}}, got {str(item)[:80]}"
                )
            templates[item["name"]] = item["template"]
    elif value is not None:
        raise TokenizerError(f"{source}: chat_template must be a string or a list of templates")
    extra = root.joinpath("additional_chat_templates")
    if extra.is_dir():
        for child in sorted(extra.iterdir(), key=lambda c: c.name):
            if child.name.endswith(".jinja") and child.is_file():
                templates.setdefault(
                    child.name[: -len(".jinja")], child.read_text(encoding="utf-8")
                )
    return templates
