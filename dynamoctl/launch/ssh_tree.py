"""The coordinated staging (:mod:`dynamoctl.modelcache.tree`) over SSH: each host's step is
an SSH session running ``python -m dynamoctl.modelcache``, ended by closing its input.
What ``up`` runs on an SSH target's worker hosts before any engine starts when the recipe
asks (``model.cache.stage_ahead``), and what ``python -m dynamoctl.launch.stage`` runs by
hand (docs/operations.md, "Coordinated staging")."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import asyncssh

from dynamoctl.launch.api import InstanceSpec, LaunchError
from dynamoctl.launch.weights import Ahead
from dynamoctl.modelcache.cache import StagingError
from dynamoctl.modelcache.tree import NodeProcess, TreeResult, stage_tree
from dynamoctl.settings.model_cache import ModelCacheSettings

Process = asyncssh.SSHClientProcess[bytes]
Command = Callable[[str, list[str]], Awaitable[Process]]
"""Starts ``argv`` on a host over SSH, output and errors merged (``SshLauncher.command``)."""
STAGED_COMPONENTS = ("worker", "follower")
"""The instances whose engines read the weights: their hosts are staged."""

log = logging.getLogger(__name__)


@dataclass
class _SshStep:
    proc: Process

    async def readline(self) -> bytes:
        return await self.proc.stdout.readline()

    def close_input(self) -> None:
        self.proc.stdin.write_eof()

    async def wait(self) -> int:
        done = await self.proc.wait()
        return done.returncode if done.returncode is not None else -1


async def stage_hosts(
    command: Command,
    hosts: Sequence[str],
    addresses: dict[str, str],
    source: str,
    settings: ModelCacheSettings,
    python: str,
) -> TreeResult:
    """``source`` into every host's cache, coordinated; StagingError naming a host."""

    async def run(host: str, argv: list[str]) -> NodeProcess:
        return _SshStep(await command(host, argv))

    return await stage_tree(run, hosts, addresses, source, settings, python=python)


async def stage_ahead(
    command: Command, instances: Sequence[InstanceSpec], wanted: Ahead, python: str
) -> None:
    """Every source onto the hosts of ``instances``' workers before they start; a failed
    host is a LaunchError naming it."""
    staged = [s for s in instances if s.component in STAGED_COMPONENTS]
    hosts = list(dict.fromkeys(spec.host for spec in staged))
    addresses = {spec.host: spec.address or spec.host for spec in staged}
    for source in wanted.sources if hosts else []:
        try:
            result = await stage_hosts(command, hosts, addresses, source, wanted.settings, python)
        except StagingError as exc:
            raise LaunchError(f"model.cache.stage_ahead: {exc}") from exc
        froms = {host: out.get("from") for host, out in result.staged.items()}
        log.info("%s staged ahead on %d hosts in %.1f s: %s", source, len(hosts),
                 result.seconds, froms)  # fmt: skip
