"""The SGLang engine adapter (``dynamoctl worker --engine sglang``): SGLang's offline
``Engine`` in the worker process, token ids in and out, its own ZeroMQ KV-event publisher
(vLLM's format) for routers, bootstrap info for disaggregation.

Written against SGLang 0.5's documented API and **not run here** (SGLang needs a newer
torch than this project's CI machines install; see docs/engines.md). Only
:mod:`dynamoctl.engines.sglang.engine` imports SGLang.
"""
