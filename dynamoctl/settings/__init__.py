"""Knobs declared once (docs/architecture.md, "Options declared once"): each group is a
pydantic model whose fields are the component's command-line flags, what the plan
renders for it, and the recipe's fields.

Each name is imported from its module when first asked for: a process loads the groups it
uses (a worker never builds the frontend's, the router's or the key file's models; pydantic
builds each model's validator as its class is made, ~0.2 s of every start for all of them).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dynamoctl.settings.base import (
        Options,
        cli_parameters,
        flag,
        from_cli,
        to_argv,
        with_options,
    )
    from dynamoctl.settings.component import ComponentSettings, Role, WorkerOptions
    from dynamoctl.settings.frontend import (
        AdmissionSettings,
        ApiKeySettings,
        DisaggSettings,
        FrontendOptions,
        ResponsesSettings,
        StreamSettings,
    )
    from dynamoctl.settings.http import HttpLimitSettings
    from dynamoctl.settings.images import ImageSettings
    from dynamoctl.settings.model_cache import ModelCacheSettings
    from dynamoctl.settings.parsers import OutputParserSettings
    from dynamoctl.settings.routing import (
        ROUTER_MODES,
        ReplicaSettings,
        RouterMode,
        RouterOptions,
        RouterSettings,
    )
    from dynamoctl.settings.tracing import TracingSettings

_WHERE = {
    "Options": "base",
    "cli_parameters": "base",
    "flag": "base",
    "from_cli": "base",
    "to_argv": "base",
    "with_options": "base",
    "ComponentSettings": "component",
    "Role": "component",
    "WorkerOptions": "component",
    "AdmissionSettings": "frontend",
    "ApiKeySettings": "frontend",
    "DisaggSettings": "frontend",
    "FrontendOptions": "frontend",
    "ResponsesSettings": "frontend",
    "StreamSettings": "frontend",
    "HttpLimitSettings": "http",
    "ImageSettings": "images",
    "ModelCacheSettings": "model_cache",
    "OutputParserSettings": "parsers",
    "ROUTER_MODES": "routing",
    "ReplicaSettings": "routing",
    "RouterMode": "routing",
    "RouterOptions": "routing",
    "RouterSettings": "routing",
    "TracingSettings": "tracing",
}
"""Each exported name's module under ``dynamoctl.settings``."""


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # once: later lookups find it here
    return value


__all__ = [
    "ROUTER_MODES",
    "AdmissionSettings",
    "ApiKeySettings",
    "ComponentSettings",
    "DisaggSettings",
    "FrontendOptions",
    "HttpLimitSettings",
    "ImageSettings",
    "ModelCacheSettings",
    "Options",
    "OutputParserSettings",
    "ReplicaSettings",
    "ResponsesSettings",
    "Role",
    "RouterMode",
    "RouterOptions",
    "RouterSettings",
    "StreamSettings",
    "TracingSettings",
    "WorkerOptions",
    "cli_parameters",
    "flag",
    "from_cli",
    "to_argv",
    "with_options",
]
