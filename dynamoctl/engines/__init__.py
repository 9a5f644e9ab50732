"""Engine adapters: the :class:`~dynamoctl.engines.api.Engine` protocol (``api.py``), each
engine's spec (``<engine>/spec.py``) and engines by name (``registry.py``).

``mocker`` (simulated, always available) lives here; real engines (``vllm``, ``sglang``,
``trtllm``) are optional extras, imported only when a worker asks for them. Nothing is
imported here: a process that reads only the specs (the frontend, the recipe) loads no
adapter.
"""
