"""The building blocks of the recipe models: their base (strict, no unknown keys, field
docstrings), the error a cross-field rule raises (naming the field, so the loader can point
at its line) and the checked scalar types fields share."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field
from pydantic_core import PydanticCustomError

RULE_ERROR = "recipe_rule"
"""Error type of cross-field rules; their ``ctx["at"]`` is the dotted path of the culprit,
relative to the model whose validator raised it."""


def rule_error(at: str, message: str) -> PydanticCustomError:
    return PydanticCustomError(RULE_ERROR, message, {"at": at})


def check_dns_label(value: str) -> str:
    if len(value) > 63 or not re.fullmatch(r"[a-z0-9][a-z0-9-]*", value):
        raise ValueError(
            "must be lowercase letters, digits and '-', start with a letter or digit "
            "and be at most 63 characters"
        )
    return value


def check_time_limit(value: str) -> str:
    match = re.fullmatch(r"(?:(\d+)-)?(\d{1,2}):(\d{2}):(\d{2})", value)
    if match is None or int(match[3]) > 59 or int(match[4]) > 59:
        raise ValueError("must look like HH:MM:SS or D-HH:MM:SS")
    return value


def check_etcd_endpoint(value: str) -> str:
    if not re.fullmatch(r"https?://[^\s/]+:\d+", value):
        raise ValueError("must look like http://HOST:PORT")
    return value


def check_ipv4(value: str) -> str:
    try:
        ipaddress.IPv4Address(value)
    except ValueError:
        raise ValueError("must be an IPv4 address, e.g. 10.0.0.5") from None
    return value


def check_unique(values: list[str]) -> list[str]:
    duplicates = sorted({v for v in values if values.count(v) > 1})
    if duplicates:
        raise ValueError(f"lists {', '.join(map(repr, duplicates))} more than once")
    return values


NonEmptyStr = Annotated[str, Field(min_length=1)]
DnsLabel = Annotated[str, AfterValidator(check_dns_label)]
Port = Annotated[int, Field(ge=1, le=65535)]
# Paths read on the head node; strict mode would refuse the YAML string otherwise.
LocalPath = Annotated[Path, Field(strict=False)]


class RecipeModel(BaseModel):
    """Strict (YAML gives real types), unknown keys refused, docstrings as descriptions."""

    model_config = ConfigDict(extra="forbid", strict=True, use_attribute_docstrings=True)


@dataclass(frozen=True)
class OneOf:
    """``Annotated`` metadata of a string field whose valid values a registry holds, asked
    when a recipe is read (an entry registered later counts too) and by the reference."""

    names: Callable[[], list[str]]

    def __call__(self, value: str) -> str:
        if value not in self.names():
            raise ValueError("must be one of " + ", ".join(map(repr, self.names())))
        return value
