"""Anthropic's Messages API (``POST /v1/messages`` and ``/v1/messages/count_tokens``) on
the same pipeline as chat completions: a request is validated in Anthropic's terms
(:mod:`.protocol`), translated to a chat request (:mod:`.translate`), generated, routed
and migrated as any other, and its answer rendered as Anthropic's message or stream
events (:mod:`.events`). Parameters follow the same written policy (docs/api.md)."""
