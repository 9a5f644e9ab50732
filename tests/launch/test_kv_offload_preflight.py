"""A KV offload disk path is checked on the node that will use it, over SSH, before
anything starts: the error names the instance, the host, the field and the path."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from dynamoctl.launch.api import InstanceSpec, LaunchError
from tests.infra.ssh_hosts import SshHosts
from tests.launch.test_ssh_launcher import PY, launcher_for

pytestmark = pytest.mark.kv_tiers
REPO = Path(__file__).resolve().parents[2]


async def test_missing_disk_path_on_an_ssh_host_fails_preflight(
    ssh_hosts2: SshHosts, tmp_path: Path
) -> None:
    host = ssh_hosts2.names[1]
    disk = tmp_path / "kv-disk"
    spec = InstanceSpec(
        name="agg-1",
        pool="agg",
        component="worker",
        host=host,
        argv=[PY, "-c", "pass"],
        paths={"kv_offload.disk_path": str(disk)},
    )
    # The hosts run this checkout's dynamoctl, whatever the machine has installed.
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\nPYTHONPATH={REPO} exec {sys.executable} "$@"\n')
    python.chmod(0o755)
    ssh = launcher_for(ssh_hosts2, python=str(python))
    try:
        with pytest.raises(LaunchError) as caught:
            await ssh.preflight([spec])
        assert str(caught.value) == (
            f"agg-1: kv_offload.disk_path {disk} on {host} does not exist; create it there "
            "(writable by the deployment's user) or change the recipe"
        )
        disk.mkdir()
        await ssh.preflight([spec])  # the same check passes once it exists
    finally:
        await ssh.close()
