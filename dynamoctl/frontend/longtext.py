"""Long prompts tokenised off the event loop, without leaving memory behind.

At ~1 µs a character a 3 MB prompt holds the thread that tokenises it for seconds, and
``Tokenizer.encode`` holds the GIL meanwhile: on the event loop every other request
would wait. Long texts go to a small thread pool and through ``encode_batch_fast``,
which releases the GIL and gives the same ids without the character offsets that no
caller reads (~0.6-0.7x the CPU of ``encode_batch`` on a 32k-token prompt).

Memory: a long text's encoding is ~130 bytes a token while it lives (bounded here by the
pool's two threads), and glibc keeps what is freed mapped. Three things bring the
process back near its baseline after a burst of huge prompts: few malloc arenas
(:func:`limit_malloc_arenas`), a heap trim a moment after big requests
(:class:`Trimmer`), and a copy of each tokenizer without the BPE word cache for huge
texts (over :data:`CACHED_CHARS`): the cache's entries, made amid hundreds of MB of
temporaries, would each pin a page of them for good. Texts up to that size, an agent's
100k-token history among them, use the model's own tokenizer and its word cache: ~0.75x
the CPU of the cache-less copy on a 32k-token prompt (benchmarks/results/
long_context_word_cache.json), and their temporaries are a few MB.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, cast

from tokenizers import Tokenizer as FastTokenizer

from dynamoctl.tokenizer.pieces import pieces

if TYPE_CHECKING:
    from dynamoctl.frontend.models import ServedModel

INLINE_CHARS = 8192
"""Texts up to this long are tokenised inline (under ~10 ms), longer ones on the pool."""
CACHED_CHARS = 512 << 10
"""Texts up to this long are tokenised with the model's tokenizer (its BPE word cache),
longer ones with a cache-less copy (the memory note above)."""
_M_ARENA_MAX = -8  # glibc's malloc.h
_CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
"""The most pieces a long text is cut into: the cores this process may run on."""


def _glibc(name: str) -> Callable[..., int] | None:
    try:
        return cast("Callable[..., int]", getattr(ctypes.CDLL(None), name))
    except (OSError, AttributeError):  # not glibc
        return None


_MALLOC_TRIM = _glibc("malloc_trim")


def limit_malloc_arenas(arenas: int = 2) -> None:
    """Call before threads start: glibc gives each thread that allocates concurrently its
    own arena (up to 8 a core), and each keeps what it once held. An explicit
    ``MALLOC_ARENA_MAX`` wins."""
    mallopt = _glibc("mallopt")
    if mallopt is not None and "MALLOC_ARENA_MAX" not in os.environ:
        mallopt(_M_ARENA_MAX, arenas)


def _malloc_trim() -> None:
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)  # a ctypes call: the GIL is released meanwhile


class LongTextEncoder:
    """Tokenises long texts on a pool of two threads: with the model's tokenizer up to
    :data:`CACHED_CHARS`, beyond with a cache-less copy of it (made on first use, on the
    pool)."""

    def __init__(self) -> None:
        self.pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="tokenize")
        self._copies: dict[int, tuple[weakref.ref[ServedModel], FastTokenizer]] = {}

    async def encode(
        self, model: ServedModel, text: str, special: bool, limit: int
    ) -> list[int] | int:
        """``text``'s ids; or, when there are ``limit`` or more, only their count (a
        refused prompt's list of ids is never built)."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.pool, self._encode, model, text, special, limit)

    def _encode(self, model: ServedModel, text: str, special: bool, limit: int) -> list[int] | int:
        words = model.tokenizer.words
        if words is not None and not special and len(text) <= CACHED_CHARS:
            known = words.encode(text, _CORES)  # what it has not seen, in pieces as below
            return len(known) if len(known) >= limit else known
        tokenizer = model.tokenizer.backend if len(text) <= CACHED_CHARS else self._copy(model)
        # In pieces, which the tokenizer's own threads encode at once (:mod:`pieces`);
        # with the post-processor whole, as its tokens belong to the whole text.
        texts = [text] if special else pieces(tokenizer, text, _CORES)
        parts = tokenizer.encode_batch_fast(texts, add_special_tokens=special)
        count = sum(map(len, parts))
        if count >= limit:
            return count
        if len(parts) == 1:
            return parts[0].ids
        ids: list[int] = []
        for part in parts:
            ids += part.ids
        return ids

    def _copy(self, model: ServedModel) -> FastTokenizer:
        held = self._copies.get(id(model))
        if held is not None and held[0]() is model:
            return held[1]
        copy = FastTokenizer.from_str(model.tokenizer.backend.to_str())
        resize = getattr(copy.model, "_resize_cache", None)  # BPE's: no word cache
        if resize is not None:
            resize(0)
        live = {k: v for k, v in self._copies.items() if v[0]() is not None}
        self._copies = {**live, id(model): (weakref.ref(model), copy)}
        return copy


class Trimmer:
    """Hands freed heap memory back to the OS a moment after big requests (without it a
    hostile burst would leave the process at its high-water mark). At most one trim a
    second, on ``pool``."""

    def __init__(self, pool: ThreadPoolExecutor) -> None:
        self._pool = pool
        self._pending: asyncio.TimerHandle | None = None

    def soon(self) -> None:
        if self._pending is None and _MALLOC_TRIM is not None:
            self._pending = asyncio.get_running_loop().call_later(1.0, self._run)

    def _run(self) -> None:
        self._pending = None
        asyncio.get_running_loop().run_in_executor(self._pool, _malloc_trim)
