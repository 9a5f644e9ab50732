"""The recipe's ``tracing`` section: OpenTelemetry traces sent to a collector (its
fields are every component's ``--otlp-*`` flags, declared once in
:mod:`dynamoctl.settings.tracing`)."""

from __future__ import annotations

from pydantic import model_validator

from dynamoctl.recipe.fields import RecipeModel, rule_error
from dynamoctl.settings.tracing import TracingSettings


class Tracing(RecipeModel, TracingSettings):
    """Send each request's spans (frontend, router pick, worker) to an OTLP collector
    (docs/operations.md, "Traces"). Absent: no traces, at no cost."""

    @model_validator(mode="after")
    def _endpoint(self) -> Tracing:
        if self.endpoint is None:
            raise rule_error("endpoint", "is required (the collector, e.g. http://HOST:4318)")
        if not self.endpoint.startswith(("http://", "https://")):
            raise rule_error("endpoint", f"{self.endpoint!r} must start with http:// or https://")
        return self
