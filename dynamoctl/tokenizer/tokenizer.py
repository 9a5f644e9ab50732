"""The tokenizer the frontend uses: encode, decode, end-of-sequence ids and chat templates."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from tokenizers import Tokenizer as FastTokenizer

from dynamoctl.tokenizer.chat import render_chat
from dynamoctl.tokenizer.errors import ChatTemplateError
from dynamoctl.tokenizer.words import WordCache

DEFAULT_TEMPLATE = "default"
"""Name of the template used unless another is asked for (transformers' convention)."""

TOOL_TEMPLATE = "tool_use"
"""Name of the template preferred when the request has tools, if the model has one."""


class Tokenizer:
    """A loaded tokenizer: a fast (Rust) ``tokenizers.Tokenizer`` plus what
    ``tokenizer_config.json`` adds (special token names, end-of-sequence ids, chat templates).

    Build one with :func:`dynamoctl.tokenizer.load_tokenizer`. Instances are immutable and
    safe to share between threads and requests (the loader caches one per source); only
    their word cache (:mod:`dynamoctl.tokenizer.words`) grows, safely, as they encode.
    """

    __slots__ = (
        "_backend",
        "_chat_templates",
        "_eos_token_ids",
        "_source",
        "_special_ids",
        "_special_tokens",
        "_words",
    )

    def __init__(
        self,
        backend: FastTokenizer,
        *,
        source: str,
        special_tokens: Mapping[str, str] | None = None,
        eos_token_ids: Iterable[int] = (),
        chat_templates: Mapping[str, str] | None = None,
    ) -> None:
        """``special_tokens`` maps template names (``bos_token``, ``eos_token``...) to token
        text; ``chat_templates`` maps names to Jinja sources (the usual one: ``default``)."""
        self._backend = backend
        self._source = source
        self._special_tokens = dict(special_tokens or {})
        self._eos_token_ids = frozenset(eos_token_ids)
        self._chat_templates = dict(chat_templates or {})
        self._special_ids = frozenset(
            i for i, tok in backend.get_added_tokens_decoder().items() if tok.special
        )
        self._words = WordCache.of(backend)

    def __repr__(self) -> str:
        return f"Tokenizer({self._source!r}, vocab_size={self.vocab_size})"

    # --- identity and vocabulary ----------------------------------------------------------

    @property
    def source(self) -> str:
        """Where this tokenizer came from: ``builtin`` or a directory."""
        return self._source

    @property
    def backend(self) -> FastTokenizer:
        """The underlying ``tokenizers.Tokenizer`` (treat as read-only: it is shared)."""
        return self._backend

    @property
    def vocab_size(self) -> int:
        """Number of token ids, added and special tokens included."""
        return self._backend.get_vocab_size(with_added_tokens=True)

    def token_to_id(self, token: str) -> int | None:
        """The id of one token's text (e.g. ``"<|eot_id|>"``), or None if not in the vocab."""
        return self._backend.token_to_id(token)

    @property
    def special_tokens(self) -> dict[str, str]:
        """The named special tokens' text (``bos_token``, ``eos_token``, ``unk_token``,
        ``pad_token``: those the model has), a copy."""
        return dict(self._special_tokens)

    @property
    def bos_token(self) -> str | None:
        """Beginning-of-sequence token text, if the model has one."""
        return self._special_tokens.get("bos_token")

    @property
    def eos_token(self) -> str | None:
        """End-of-sequence token text (``tokenizer_config.json``'s ``eos_token``), if any."""
        return self._special_tokens.get("eos_token")

    @property
    def bos_token_id(self) -> int | None:
        """Id of :attr:`bos_token`, if any."""
        return None if self.bos_token is None else self.token_to_id(self.bos_token)

    @property
    def eos_token_id(self) -> int | None:
        """Id of :attr:`eos_token`, if any."""
        return None if self.eos_token is None else self.token_to_id(self.eos_token)

    @property
    def eos_token_ids(self) -> frozenset[int]:
        """Every id that ends generation: the eos token, the model's generation config
        ``eos_token_id`` and end-of-turn tokens such as ``<|eot_id|>`` (the engine's
        ``stop_token_ids``)."""
        return self._eos_token_ids

    @property
    def special_token_ids(self) -> frozenset[int]:
        """Ids of special tokens (what ``skip_special_tokens`` drops when decoding)."""
        return self._special_ids

    # --- text <-> ids ---------------------------------------------------------------------

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text``.

        ``add_special_tokens`` runs the tokenizer's post-processor (for Llama-style models:
        prepend ``<|begin_of_text|>``). Pass False for a prompt rendered by
        :meth:`apply_chat_template`: the template already wrote the BOS token. Special token
        text inside ``text`` is parsed as special tokens, as transformers does.
        """
        if not add_special_tokens and self._words is not None:
            return self._words.encode(text)
        # The same ids as ``encode``, without the character offsets nobody here reads:
        # ~0.75x its CPU from a few hundred tokens on (an agent's new text each turn),
        # ~0.9x for a handful (benchmarks/results/tokenizer_encode.json).
        return self._backend.encode_batch_fast([text], add_special_tokens=add_special_tokens)[0].ids

    @property
    def words(self) -> WordCache | None:
        """Its word cache, which :meth:`encode` uses without the post-processor (None
        for a tokenizer the cache is not proven for: :mod:`dynamoctl.tokenizer.words`)."""
        return self._words

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Text of ``ids``. Ids outside the vocabulary are ignored; bytes that do not form
        valid UTF-8 (an incomplete character at the end) become U+FFFD."""
        return self._backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    # --- chat -----------------------------------------------------------------------------

    @property
    def chat_template(self) -> str | None:
        """The default chat template's Jinja source, or None."""
        return self._chat_templates.get(DEFAULT_TEMPLATE)

    @property
    def chat_template_names(self) -> frozenset[str]:
        """Names of the model's chat templates (usually just ``default``)."""
        return frozenset(self._chat_templates)

    def apply_chat_template(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
        *,
        template_name: str | None = None,
        **template_kwargs: Any,
    ) -> str:
        """Render a conversation into the model's prompt text, as transformers'
        ``apply_chat_template(..., tokenize=False)`` does.

        ``messages`` are OpenAI-style dicts (``role``, ``content``...), passed to the
        template as they are; ``add_generation_prompt`` appends the header that opens the
        assistant's turn; ``tools`` are JSON schemas. The template also sees the special
        tokens (``bos_token``, ``eos_token``...) and ``template_kwargs``. The template picked
        is ``template_name``, else ``tool_use`` when there are tools and the model has that
        template, else ``default``. Encode the result with ``add_special_tokens=False``.

        Raises :class:`ChatTemplateError` if the model has no such template or the template
        fails on this conversation.
        """
        template = self._select_template(template_name, bool(tools))
        return render_chat(
            template,
            messages,
            owner=self._source,
            add_generation_prompt=add_generation_prompt,
            tools=tools,
            variables={**self._special_tokens, **template_kwargs},
        )

    def _select_template(self, name: str | None, has_tools: bool) -> str:
        if not self._chat_templates:
            raise ChatTemplateError(
                f"tokenizer '{self._source}' has no chat template, so it cannot format chat "
                "messages: add chat_template to its tokenizer_config.json (or a "
                "chat_template.jinja file next to it), or send prompts to /v1/completions"
            )
        if name is None:
            use_tools = has_tools and TOOL_TEMPLATE in self._chat_templates
            name = TOOL_TEMPLATE if use_tools else DEFAULT_TEMPLATE
        try:
            return self._chat_templates[name]
        except KeyError:
            names = ", ".join(sorted(self._chat_templates))
            raise ChatTemplateError(
                f"tokenizer '{self._source}' has no chat template named '{name}' (it has: {names})"
            ) from None
