"""Locked by default: what ``up`` refuses to open on a network without being told.

A recipe whose target spans several hosts serves on a cluster network that other users
and jobs share. Two doors would stand open there by default, so ``up`` refuses to start
(before anything starts, dry runs excepted) unless the recipe closes them or says, with a
named field, that it means to leave them open (docs/security.md, "Locked by default"):

- the OpenAI endpoint on a non-loopback address without API keys
  (``security.open_endpoint: true`` to mean it);
- an external etcd reached over plain ``http://`` (``discovery.allow_plaintext: true``).

The planes and a managed etcd are already locked there (``security.curve``,
``security.etcd_tls``); a recipe that turns them off has said so explicitly.
"""

from __future__ import annotations

from dynamoctl.recipe.discovery import EtcdDiscovery
from dynamoctl.recipe.models import Recipe
from dynamoctl.util.net import is_loopback


def open_doors(recipe: Recipe) -> list[str]:
    """What ``recipe`` would leave open without saying so; [] when nothing."""
    if not recipe.multi_host:
        return []
    found = []
    frontend = recipe.frontend
    keyed = frontend.api_keys_file is not None or frontend.api_keys_env is not None
    listens = frontend.host or "the head node's address"
    if not keyed and not recipe.security.open_endpoint and not is_loopback(listens):
        found.append(
            f"frontend: listens on {listens} of a multi-host target without API keys: "
            "anyone on the cluster network could use it. Name keys with "
            "frontend.api_keys_env (a variable) or frontend.api_keys_file, or set "
            "security.open_endpoint: true to serve it open on purpose"
        )
    discovery = recipe.discovery
    if (
        isinstance(discovery, EtcdDiscovery)
        and not discovery.allow_plaintext
        and any(e.startswith("http://") for e in discovery.endpoints)
    ):
        found.append(
            "discovery.endpoints: plain http:// etcd on a multi-host target: discovery "
            "crosses the network in clear and anyone who reaches it can rewrite it. Use "
            "https:// endpoints (ca_file, cert_file, key_file), managed: true (TLS by "
            "default), or set discovery.allow_plaintext: true to accept it on purpose"
        )
    return found
