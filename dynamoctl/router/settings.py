"""Routing knobs: declared once in :mod:`dynamoctl.settings.routing` (the recipe's
``frontend.router`` and both routers' flags); the policies' registry must list the same
modes."""

from __future__ import annotations

from dynamoctl.router.policies import mode_names
from dynamoctl.settings.routing import RouterSettings

__all__ = ["RouterSettings", "check_mode"]


def check_mode(mode: str) -> None:
    if mode not in mode_names():
        raise ValueError(f"unknown router mode {mode!r}; valid: {', '.join(mode_names())}")
