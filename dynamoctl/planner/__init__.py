"""The SLA planner's decision core (docs/planner.md): knobs (``settings``), load
predictors (``predict``), the performance model and replica formulas (``perf``), the
records it decides over (``records``), the GPU budget (``budget``) and the two loops as
pure functions (``decide``). Nothing here does I/O or keeps time: the ``dynamoctl planner``
component feeds it metrics and a clock and applies its decisions through the supervisor."""
