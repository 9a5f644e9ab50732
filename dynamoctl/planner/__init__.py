"""The SLA planner (docs/planner.md). Its decision core does no I/O and keeps no time:
knobs (``settings``), load predictors (``predict``), the performance model and replica
formulas (``perf``), the records it decides over (``records``), the GPU budget
(``budget``) and the two loops as pure functions (``decide``). The ``dynamoctl planner``
component around it observes the deployment (``observe``), applies decisions through the
supervisor (``apply``), runs the loop (``service``) and serves ``/metrics`` and
``/health`` (``http``, ``main``)."""
