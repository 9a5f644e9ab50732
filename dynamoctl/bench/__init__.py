"""``dynamoctl bench``: a load generator for any OpenAI-compatible endpoint.

``workload`` says what is sent (synthetic sessions, traces), ``schedule`` when (closed or
open loop, on an injectable clock), ``client`` and ``http`` how (one-write HTTP/1.1, SSE),
``stats`` what it measured, ``report`` and ``plots`` the files it leaves, ``runner`` ties
them together for the CLI and the scripts in ``benchmarks/``.
"""
