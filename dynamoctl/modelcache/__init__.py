"""The node-local model cache (docs/operations.md, "Model cache"): a model directory on the
shared path is copied once per node and revision into ``model.cache.dir``, checked (sizes,
and SHA-256 of the files an engine trusts), reused by every later start on that node, and
evicted least recently used when the cache is over its bound. :mod:`.scan` reads a source,
:mod:`.copy` copies and hashes it, :mod:`.cache` keeps the entries, :mod:`.stage` is what a
worker does before its engine starts, ``python -m dynamoctl.modelcache`` stages by hand or
from a Slurm step (one per node)."""
