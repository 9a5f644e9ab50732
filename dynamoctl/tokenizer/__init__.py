"""Tokenisation for the frontend: load a tokenizer, render chat templates, stream text back.

- :func:`load_tokenizer` reads ``builtin`` (a small byte-level BPE with a Llama-3 chat
  template, shipped as package data for the ``mocker`` engine) or a local model directory
  with ``tokenizer.json``. Nothing is ever downloaded.
- :class:`Tokenizer` encodes, decodes, knows the end-of-sequence ids and renders chat
  templates in a sandbox, as transformers does.
- :class:`IncrementalDetokenizer` turns streamed token ids into text without splitting
  characters; :class:`StopStringMatcher` applies stop strings across chunks.

See ``docs/tokenizer.md``.
"""

from dynamoctl.tokenizer.detokenize import IncrementalDetokenizer
from dynamoctl.tokenizer.errors import ChatTemplateError, TokenizerError, TokenizerNotFound
from dynamoctl.tokenizer.loader import BUILTIN, clear_cache, load_tokenizer
from dynamoctl.tokenizer.stop import StopResult, StopStringMatcher
from dynamoctl.tokenizer.tokenizer import Tokenizer

__all__ = [
    "BUILTIN",
    "ChatTemplateError",
    "IncrementalDetokenizer",
    "StopResult",
    "StopStringMatcher",
    "Tokenizer",
    "TokenizerError",
    "TokenizerNotFound",
    "clear_cache",
    "load_tokenizer",
]
