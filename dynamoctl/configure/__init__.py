"""``dynamoctl configure``: a deployment recommended from model, GPUs and SLA by AI
Configurator (``aic.py``, the only module importing it), written as a recipe, checked by
simulation (docs/configure.md)."""
