"""The TensorRT-LLM engine adapter (``dynamoctl worker --engine trtllm``): the ``LLM`` API
(PyTorch backend) in the worker process, token ids in and out, its KV-cache event API
converted into vLLM's format and published by the worker, its disaggregated parameters
(``opaque_state``) passed through opaquely.

Written against TensorRT-LLM 1.x's documented API and **not run here** (its PyPI package
downloads from another index; see docs/engines.md). Only
:mod:`dynamoctl.engines.trtllm.engine` imports TensorRT-LLM.
"""
