"""The OpenAI compatibility policy as data: every request parameter of the chat and
completions APIs, of vLLM's common extensions and of vLLM's ``/tokenize`` and
``/detokenize``, of Anthropic's messages, OpenAI's responses and embeddings, declared once
as supported, accepted when neutral, or refused, with the reason (docs/api.md shows this
table; a test keeps both, and the request models, in step).

* **supported**: a field of the request model (:mod:`dynamoctl.frontend.protocol`), carried
  to where it takes effect.
* **accepted when neutral**: not implemented, but the values that ask for nothing (null,
  and the ones listed: ``repetition_penalty: 1.0``, ``best_of: 1``, ``store: false``...)
  are accepted, since SDKs and benchmark clients send them by default; any other value is
  a 400 naming the parameter.
* **refused**: not implemented and nothing to be neutral about; only null is accepted.

A row named ``object.key`` is a key of an object parameter (``stream_options.include_usage``),
checked by that object's model (:func:`dynamoctl.frontend.compat.check_object_keys`).

:mod:`dynamoctl.frontend.compat` applies the table. Another module that implements a
parameter (structured outputs, tools) flips its row to ``SUPPORTED`` here and adds the
field to the request model.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Literal

Endpoint = Literal[
    "chat",
    "completions",
    "tokenize",
    "detokenize",
    "messages",
    "count_tokens",
    "responses",
    "embeddings",
]
BOTH: tuple[Endpoint, ...] = ("chat", "completions")
CHAT: tuple[Endpoint, ...] = ("chat",)
COMPLETIONS: tuple[Endpoint, ...] = ("completions",)
TOKENIZE: tuple[Endpoint, ...] = ("tokenize",)
DETOKENIZE: tuple[Endpoint, ...] = ("detokenize",)
TOKENIZATION: tuple[Endpoint, ...] = ("tokenize", "detokenize")
MESSAGES: tuple[Endpoint, ...] = ("messages",)
CONVERSATION: tuple[Endpoint, ...] = ("messages", "count_tokens")
RESPONSES: tuple[Endpoint, ...] = ("responses",)
EMBEDDINGS: tuple[Endpoint, ...] = ("embeddings",)
ENDPOINTS: tuple[Endpoint, ...] = (*BOTH, *TOKENIZATION, *CONVERSATION, *RESPONSES, *EMBEDDINGS)
"""``POST /v1/chat/completions``, ``/v1/completions``, vLLM's ``/tokenize`` and
``/detokenize`` (:mod:`dynamoctl.frontend.tokenization`), and Anthropic's
``/v1/messages`` and ``/v1/messages/count_tokens`` (:mod:`dynamoctl.frontend.anthropic`),
OpenAI's ``/v1/responses`` (:mod:`dynamoctl.frontend.responses`) and ``/v1/embeddings``
(:mod:`dynamoctl.frontend.embeddings`)."""


class Support(enum.Enum):
    SUPPORTED = "supported"
    NEUTRAL = "accepted when neutral"
    REFUSED = "refused"


@dataclass(frozen=True)
class Param:
    """One request parameter's row."""

    name: str
    endpoints: tuple[Endpoint, ...]
    support: Support
    origin: Literal["OpenAI", "vLLM", "Anthropic"]
    why: str
    """What it does here, or why it is not implemented."""
    neutral: tuple[Any, ...] = ()
    """Values besides null accepted for a parameter not implemented (``NEUTRAL``)."""


S, N, R = Support.SUPPORTED, Support.NEUTRAL, Support.REFUSED

POLICY: tuple[Param, ...] = (
    # -- OpenAI, both endpoints -----------------------------------------------------------
    Param("model", BOTH, S, "OpenAI", "served model name (`GET /v1/models`)"),
    Param(
        "max_tokens", BOTH, S, "OpenAI", "most tokens per choice; default: the rest of the context"
    ),
    Param("temperature", BOTH, S, "OpenAI", "passed to the engine"),
    Param("top_p", BOTH, S, "OpenAI", "passed to the engine"),
    Param("seed", BOTH, S, "OpenAI", "passed to the engine; choice i of `n` uses seed + i"),
    Param("stop", BOTH, S, "OpenAI", "up to 4 strings, matched by the frontend on the text"),
    Param("stream", BOTH, S, "OpenAI", "server-sent events"),
    Param(
        "stream_options",
        BOTH,
        S,
        "OpenAI",
        "with `stream: true`; its keys: the `stream_options.` rows",
    ),
    Param(
        "stream_options.include_usage", BOTH, S, "OpenAI", "a final chunk with the request's usage"
    ),
    Param(
        "stream_options.include_obfuscation",
        BOTH,
        N,
        "OpenAI",
        "no obfuscation padding is added to chunks",
        (False,),
    ),
    Param(
        "stream_options.continuous_usage_stats",
        BOTH,
        S,
        "vLLM",
        "with `include_usage`: every chunk carries its choice's usage so far (as vLLM)",
    ),
    Param(
        "n",
        BOTH,
        S,
        "OpenAI",
        "fan-out: an engine request per choice, up to the frontend's `max_choices`",
    ),
    Param("presence_penalty", BOTH, S, "OpenAI", "passed to the engine"),
    Param("frequency_penalty", BOTH, S, "OpenAI", "passed to the engine"),
    Param("logit_bias", BOTH, S, "OpenAI", "token id → bias in [-100, 100], passed to the engine"),
    Param(
        "logprobs",
        BOTH,
        S,
        "OpenAI",
        "per-token log-probabilities from the engine (chat: a boolean; completions: "
        "how many alternatives, 0-20)",
    ),
    Param("user", BOTH, S, "OpenAI", "informational: asks for no behaviour (nothing is recorded)"),
    Param(
        "max_completion_tokens",
        BOTH,
        S,
        "OpenAI",
        "newer name of `max_tokens` (on completions too, as vLLM); wins over it",
    ),
    Param("service_tier", BOTH, N, "OpenAI", "one tier only", ("auto", "default")),
    # -- OpenAI, chat ---------------------------------------------------------------------
    Param(
        "messages",
        CHAT,
        S,
        "OpenAI",
        "rendered by the model's chat template; `name`, `tool_calls`, `tool_call_id` "
        "are passed to it; content parts `text` and `image_url` (a vision model's: a "
        "`data:` URL, or `http(s)` under the recipe's `image_fetch_prefixes`; `detail` "
        "`auto` only; see Images)",
    ),
    Param("top_logprobs", CHAT, S, "OpenAI", "alternatives per token (0-20) with `logprobs: true`"),
    Param("store", CHAT, N, "OpenAI", "nothing is stored", (False,)),
    Param("metadata", CHAT, N, "OpenAI", "only meaningful with `store`", ({},)),
    Param("modalities", CHAT, N, "OpenAI", "text output only", (["text"],)),
    Param("audio", CHAT, R, "OpenAI", "text output only"),
    Param("prediction", CHAT, R, "OpenAI", "no speculative decoding from a client's prediction"),
    Param("web_search_options", CHAT, R, "OpenAI", "no web search"),
    Param("reasoning_effort", CHAT, R, "OpenAI", "not implemented"),
    Param("verbosity", CHAT, N, "OpenAI", "not implemented", ("medium",)),
    Param(
        "prompt_cache_key",
        CHAT,
        R,
        "OpenAI",
        "caching is automatic (KV-aware routing); no key is needed",
    ),
    Param("safety_identifier", CHAT, S, "OpenAI", "informational, like `user`"),
    # Structured outputs and tools: dynamoctl.structured (docs/api.md).
    Param(
        "response_format",
        BOTH,
        S,
        "OpenAI",
        "`text`, `json_object` or `json_schema`, enforced by the engine's guided decoding",
    ),
    Param("tools", CHAT, S, "OpenAI", "rendered by the chat template; calls parsed back"),
    Param(
        "tool_choice",
        CHAT,
        S,
        "OpenAI",
        "`none`, `auto` (the model's tool-call parser), `required` or a named function "
        "(guided decoding)",
    ),
    Param("parallel_tool_calls", CHAT, S, "OpenAI", "`false`: at most one call"),
    Param("functions", CHAT, N, "OpenAI", "deprecated form of `tools`", ([],)),
    Param("function_call", CHAT, N, "OpenAI", "deprecated form of `tool_choice`", ("none",)),
    # -- OpenAI, completions --------------------------------------------------------------
    Param(
        "prompt",
        COMPLETIONS,
        S,
        "OpenAI",
        "text, token ids, or a batch of either (choice index: prompt index * n + i)",
    ),
    Param(
        "echo",
        COMPLETIONS,
        S,
        "OpenAI",
        "the prompt's text precedes the completion; with `logprobs`, the prompt's tokens lead "
        "`logprobs` (the first's `token_logprobs` and `top_logprobs` null), not with `stream`",
    ),
    Param(
        "best_of", COMPLETIONS, N, "OpenAI", "server-side best-of is not implemented; use `n`", (1,)
    ),
    Param("suffix", COMPLETIONS, N, "OpenAI", "no fill-in-the-middle", ("",)),
    # -- vLLM extensions ------------------------------------------------------------------
    Param("top_k", BOTH, S, "vLLM", "passed to the engine (-1 or 0: off)"),
    Param(
        "prompt_logprobs",
        COMPLETIONS,
        S,
        "vLLM",
        "each choice's `prompt_logprobs`: per prompt token `{id: {logprob, rank, "
        "decoded_token}}` (first null), 0 to 20 alternatives, not with `stream`",
    ),
    Param("min_p", BOTH, S, "vLLM", "passed to the engine"),
    Param("repetition_penalty", BOTH, S, "vLLM", "passed to the engine"),
    Param(
        "min_tokens", BOTH, S, "vLLM", "no end-of-sequence or stop token before this many tokens"
    ),
    Param("ignore_eos", BOTH, S, "vLLM", "generate exactly `max_tokens` (benchmarks)"),
    Param(
        "stop_token_ids", BOTH, S, "vLLM", "token ids that end a choice (even with `ignore_eos`)"
    ),
    Param(
        "skip_special_tokens", BOTH, N, "vLLM", "special tokens are always skipped in text", (True,)
    ),
    Param(
        "spaces_between_special_tokens", BOTH, N, "vLLM", "the tokenizer's default only", (True,)
    ),
    Param(
        "include_stop_str_in_output", BOTH, N, "vLLM", "stop strings are never returned", (False,)
    ),
    Param("use_beam_search", BOTH, N, "vLLM", "no beam search", (False,)),
    Param("length_penalty", BOTH, N, "vLLM", "only meaningful with beam search", (1, 1.0)),
    Param("bad_words", BOTH, N, "vLLM", "not implemented", ([],)),
    Param("allowed_token_ids", BOTH, R, "vLLM", "not implemented"),
    Param("prompt_logprobs", CHAT, R, "vLLM", "not implemented on chat (completions has it)"),
    Param(
        "truncate_prompt_tokens",
        BOTH,
        R,
        "vLLM",
        "a prompt longer than the context is refused, never truncated",
    ),
    Param("priority", BOTH, N, "vLLM", "no priority scheduling", (0,)),
    Param("return_tokens_as_token_ids", BOTH, N, "vLLM", "tokens are returned as text", (False,)),
    Param("logits_processors", BOTH, R, "vLLM", "no custom logits processors"),
    Param("guided_json", BOTH, S, "vLLM", "as `structured_outputs.json` (older vLLM)"),
    Param("guided_regex", BOTH, S, "vLLM", "as `structured_outputs.regex` (older vLLM)"),
    Param("guided_choice", BOTH, S, "vLLM", "as `structured_outputs.choice` (older vLLM)"),
    Param("guided_grammar", BOTH, S, "vLLM", "as `structured_outputs.grammar` (older vLLM)"),
    Param(
        "structured_outputs",
        BOTH,
        S,
        "vLLM",
        "one of `json`, `regex`, `choice`, `grammar`, `json_object`, by guided decoding",
    ),
    Param(
        "add_special_tokens",
        CHAT,
        N,
        "vLLM",
        "the chat template writes the special tokens",
        (False,),
    ),
    Param(
        "add_special_tokens",
        COMPLETIONS,
        N,
        "vLLM",
        "text prompts always get the tokenizer's special tokens",
        (True,),
    ),
    Param(
        "add_generation_prompt", CHAT, N, "vLLM", "the assistant's turn is always opened", (True,)
    ),
    Param("continue_final_message", CHAT, N, "vLLM", "not implemented", (False,)),
    Param("echo", CHAT, N, "vLLM", "not implemented on chat", (False,)),
    Param("chat_template", CHAT, R, "vLLM", "the model's own template only"),
    Param("chat_template_kwargs", CHAT, N, "vLLM", "not implemented", ({},)),
    Param("documents", CHAT, R, "vLLM", "not implemented"),
    Param("request_id", BOTH, R, "vLLM", "the frontend names requests"),
    Param("cache_salt", BOTH, R, "vLLM", "no per-tenant cache isolation"),
    Param("kv_transfer_params", BOTH, R, "vLLM", "disaggregation is the frontend's decision"),
    Param("vllm_xargs", BOTH, R, "vLLM", "not implemented"),
    # -- vLLM's /tokenize and /detokenize -------------------------------------------------
    Param(
        "model", TOKENIZATION, S, "vLLM", "served model name; may be left out while one is served"
    ),
    Param("prompt", TOKENIZE, S, "vLLM", "text to tokenise (or `messages`)"),
    Param(
        "messages",
        TOKENIZE,
        S,
        "vLLM",
        "rendered by the model's chat template, then tokenised (image parts are refused)",
    ),
    Param(
        "add_special_tokens",
        TOKENIZE,
        S,
        "vLLM",
        "the tokenizer's special tokens (BOS); default: true for `prompt`, false for `messages`",
    ),
    Param("add_generation_prompt", TOKENIZE, S, "vLLM", "`messages`: open the assistant's turn"),
    Param("tools", TOKENIZE, S, "vLLM", "`messages`: rendered by the chat template"),
    Param("return_token_strs", TOKENIZE, S, "vLLM", "also return each token's text"),
    Param("continue_final_message", TOKENIZE, N, "vLLM", "not implemented", (False,)),
    Param("chat_template", TOKENIZE, R, "vLLM", "the model's own template only"),
    Param("chat_template_kwargs", TOKENIZE, N, "vLLM", "not implemented", ({},)),
    Param("media_io_kwargs", TOKENIZE, R, "vLLM", "text only"),
    Param("mm_processor_kwargs", TOKENIZE, R, "vLLM", "text only"),
    Param("tokens", DETOKENIZE, S, "vLLM", "token ids, each below the vocabulary's size"),
    # -- OpenAI's /v1/embeddings (and vLLM's extensions of it) --------------------------------
    Param(
        "model", EMBEDDINGS, S, "OpenAI", "an embedding model's name (recipe `model.task: embed`)"
    ),
    Param(
        "input",
        EMBEDDINGS,
        S,
        "OpenAI",
        "a string, a list of strings, a token list or a list of token lists; at most the "
        "frontend's `max_choices` inputs, each within the model's context",
    ),
    Param(
        "encoding_format",
        EMBEDDINGS,
        S,
        "OpenAI",
        "`float` (default) or `base64` (little-endian float32, as OpenAI sends)",
    ),
    Param(
        "dimensions",
        EMBEDDINGS,
        S,
        "OpenAI",
        "the first `dimensions`, renormalised, where the model allows it (Matryoshka); "
        "otherwise only its own size",
    ),
    Param("user", EMBEDDINGS, S, "OpenAI", "informational: asks for no behaviour"),
    Param(
        "add_special_tokens",
        EMBEDDINGS,
        S,
        "vLLM",
        "string inputs: the tokenizer's special tokens (default: true)",
    ),
    Param("use_activation", EMBEDDINGS, N, "vLLM", "embeddings are always normalised", (True,)),
    Param("embed_dtype", EMBEDDINGS, N, "vLLM", "float32 only", ("float32",)),
    Param("endianness", EMBEDDINGS, N, "vLLM", "little-endian only", ("native", "little")),
    Param("priority", EMBEDDINGS, N, "vLLM", "one priority class", (0,)),
    Param("truncate_prompt_tokens", EMBEDDINGS, R, "vLLM", "an input past the context is a 400"),
    Param("messages", EMBEDDINGS, R, "vLLM", "text and token inputs only"),
    Param("request_id", EMBEDDINGS, R, "vLLM", "the frontend names requests"),
    # -- Anthropic's /v1/messages and /v1/messages/count_tokens -----------------------------
    Param("model", CONVERSATION, S, "Anthropic", "served model name (`GET /v1/models`)"),
    Param(
        "messages",
        CONVERSATION,
        S,
        "Anthropic",
        "`text`, `tool_use`, `tool_result` and `thinking` blocks (earlier thinking is left "
        "out of the prompt); `cache_control` is accepted: prefix caching is automatic",
    ),
    Param("system", CONVERSATION, S, "Anthropic", "a string or text blocks: the system message"),
    Param(
        "tools",
        CONVERSATION,
        S,
        "Anthropic",
        "client tools (`input_schema`); server tools (web search, code execution) are refused",
    ),
    Param(
        "tool_choice",
        CONVERSATION,
        S,
        "Anthropic",
        "`auto`, `any` (OpenAI's `required`), `tool` (a named function), `none`; "
        "`disable_parallel_tool_use`",
    ),
    Param(
        "thinking",
        CONVERSATION,
        S,
        "Anthropic",
        "`enabled`: the reasoning parser's thinking as `thinking` blocks (`budget_tokens` < "
        "`max_tokens`, a target: both share `max_tokens`); otherwise thinking is not shown",
    ),
    Param("max_tokens", MESSAGES, S, "Anthropic", "required: most tokens to generate"),
    Param(
        "stop_sequences",
        MESSAGES,
        S,
        "Anthropic",
        "up to 4 strings; the one that matched is the answer's `stop_sequence`",
    ),
    Param("stream", MESSAGES, S, "Anthropic", "Anthropic's stream events"),
    Param("temperature", MESSAGES, S, "Anthropic", "0-1, passed to the engine"),
    Param("top_p", MESSAGES, S, "Anthropic", "passed to the engine"),
    Param("top_k", MESSAGES, S, "Anthropic", "passed to the engine"),
    Param("metadata", MESSAGES, S, "Anthropic", "`user_id`: informational, recorded nowhere"),
    Param(
        "service_tier",
        MESSAGES,
        N,
        "Anthropic",
        "one tier: every request is served alike",
        ("auto", "standard_only"),
    ),
    Param(
        "cache_control",
        MESSAGES,
        S,
        "Anthropic",
        "accepted (here and on blocks): prefix caching is automatic, by the KV router and "
        "the engines' prefix caches",
    ),
    Param("speed", MESSAGES, N, "Anthropic", "one speed", ("standard",)),
    Param("inference_geo", MESSAGES, R, "Anthropic", "the deployment runs where it runs"),
    Param("output_config", MESSAGES, R, "Anthropic", "not implemented"),
    Param("diagnostics", MESSAGES, R, "Anthropic", "not implemented"),
    Param("container", MESSAGES, R, "Anthropic", "no code-execution containers"),
    Param("mcp_servers", CONVERSATION, R, "Anthropic", "no MCP connector"),
    Param("context_management", CONVERSATION, R, "Anthropic", "no context editing"),
    # -- OpenAI's /v1/responses -------------------------------------------------------------
    Param("model", RESPONSES, S, "OpenAI", "served model name (`GET /v1/models`)"),
    Param(
        "input",
        RESPONSES,
        S,
        "OpenAI",
        "text, or items: messages (`input_text`, `output_text` parts), `function_call`, "
        "`function_call_output`, `reasoning` (left out of the prompt)",
    ),
    Param("instructions", RESPONSES, S, "OpenAI", "a leading system message, this response only"),
    Param("max_output_tokens", RESPONSES, S, "OpenAI", "most tokens to generate"),
    Param("temperature", RESPONSES, S, "OpenAI", "passed to the engine"),
    Param("top_p", RESPONSES, S, "OpenAI", "passed to the engine"),
    Param("stream", RESPONSES, S, "OpenAI", "the typed stream events"),
    Param("tools", RESPONSES, S, "OpenAI", "function tools; built-in tools are refused"),
    Param("tool_choice", RESPONSES, S, "OpenAI", "`none`, `auto`, `required`, a named function"),
    Param("parallel_tool_calls", RESPONSES, S, "OpenAI", "`false`: at most one call"),
    Param(
        "text",
        RESPONSES,
        S,
        "OpenAI",
        "`format`: `text`, `json_object`, `json_schema` (enforced by the engine)",
    ),
    Param(
        "previous_response_id",
        RESPONSES,
        S,
        "OpenAI",
        "continue a stored response (this frontend's store; unknown: 404)",
    ),
    Param("store", RESPONSES, S, "OpenAI", "keep the response (bounded, in memory)"),
    Param("metadata", RESPONSES, S, "OpenAI", "up to 16 string pairs, returned as given"),
    Param("user", RESPONSES, S, "OpenAI", "informational: asks for no behaviour"),
    Param("safety_identifier", RESPONSES, S, "OpenAI", "informational, like `user`"),
    Param("reasoning", RESPONSES, N, "OpenAI", "the model reasons as it does", ({},)),
    Param("truncation", RESPONSES, N, "OpenAI", "too long is a 400", ("disabled",)),
    Param("background", RESPONSES, N, "OpenAI", "answered in the foreground", (False,)),
    Param("include", RESPONSES, N, "OpenAI", "nothing extra to include", ([],)),
    Param("service_tier", RESPONSES, N, "OpenAI", "one tier", ("auto", "default")),
    Param("conversation", RESPONSES, R, "OpenAI", "no Conversations API; use previous_response_id"),
    Param("prompt", RESPONSES, R, "OpenAI", "no stored prompt templates"),
    Param("max_tool_calls", RESPONSES, R, "OpenAI", "not implemented"),
    Param("top_logprobs", RESPONSES, R, "OpenAI", "not implemented on this endpoint"),
    Param("prompt_cache_key", RESPONSES, R, "OpenAI", "prefix caching is automatic"),
    Param("prompt_cache_retention", RESPONSES, R, "OpenAI", "prefix caching is automatic"),
)
