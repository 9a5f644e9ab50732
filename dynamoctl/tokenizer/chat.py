"""Chat templates: Jinja rendering the way transformers does it, in a sandbox.

Model directories carry their prompt format as a Jinja template (``chat_template`` in
``tokenizer_config.json``). Templates are written against transformers' environment, so we
reproduce it: an immutable sandbox (a template cannot mutate the messages or reach Python
internals), ``trim_blocks`` and ``lstrip_blocks``, the ``loopcontrols`` extension, and the
names templates rely on: ``raise_exception``, ``strftime_now`` and a ``tojson`` that does
not escape HTML and accepts ``indent``/``separators``/``sort_keys``.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, NoReturn

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

from dynamoctl.tokenizer.errors import ChatTemplateError


def _raise_exception(message: str) -> NoReturn:
    raise jinja2.TemplateError(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | str | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # Jinja's own tojson escapes <, >, & and ' for HTML, which would change the prompt.
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@functools.lru_cache(maxsize=1)
def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


@functools.lru_cache(maxsize=64)
def compile_template(source: str) -> jinja2.Template:
    """Compile a chat template once; raises :class:`jinja2.TemplateSyntaxError`."""
    return _environment().from_string(source)


def render_chat(
    template: str,
    messages: Sequence[Mapping[str, Any]],
    *,
    owner: str,
    add_generation_prompt: bool,
    tools: Sequence[Mapping[str, Any]] | None,
    variables: Mapping[str, Any],
) -> str:
    """Render ``template`` for one conversation.

    ``variables`` are the special tokens (``bos_token``, ``eos_token``...) and any extra
    template arguments; ``owner`` names the tokenizer in error messages.
    """
    try:
        compiled = compile_template(template)
    except jinja2.TemplateSyntaxError as exc:
        raise ChatTemplateError(
            f"the chat template of tokenizer '{owner}' does not compile (line {exc.lineno}: "
            f"{exc.message}); fix chat_template in its tokenizer_config.json"
        ) from exc
    try:
        return compiled.render(
            {
                **variables,
                "messages": list(messages),
                "tools": list(tools) if tools is not None else None,
                "documents": None,
                "add_generation_prompt": add_generation_prompt,
            }
        )
    except Exception as exc:
        # A template is third-party code run on request data: whatever it raises (its own
        # raise_exception, a sandbox violation, a TypeError on a malformed message) means
        # this conversation cannot be rendered, which is the client's error, not ours.
        raise ChatTemplateError(
            f"the chat template of tokenizer '{owner}' rejected the conversation: {exc}"
        ) from exc
