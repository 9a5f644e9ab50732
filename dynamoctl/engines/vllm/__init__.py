"""The vLLM engine adapter (``dynamoctl worker --engine vllm``).

vLLM's ``AsyncLLM`` runs inside the worker process (its engine core in a child process, as
vLLM always does), fed token ids; its own ZeroMQ KV-event publisher is what routers
subscribe to. Only :mod:`dynamoctl.engines.vllm.engine` imports vLLM; the other modules
are plain Python so they can be tested, and type-checked, without it.
"""
