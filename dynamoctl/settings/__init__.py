"""Knobs declared once (docs/architecture.md, "Options declared once"): each group is a
pydantic model whose fields are the component's command-line flags, what the plan
renders for it, and the recipe's fields. Light to import: the recipe loads them."""

from dynamoctl.settings.base import Options, cli_parameters, flag, from_cli, to_argv, with_options
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
