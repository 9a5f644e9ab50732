"""Fixtures for the launcher tests: real SSH hosts (network namespaces with an sshd each),
known by name (``/etc/hosts``, ``known_hosts``): see tests/infra/ssh_hosts.py."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.infra.ssh_hosts import SshHosts, ssh_hosts


@pytest.fixture(scope="session")
def ssh_hosts2(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshHosts]:
    """Two SSH hosts for the session. sshd allows 4 sessions per connection (default 10), so
    the launcher's extra connections are exercised without starting a dozen instances."""
    with ssh_hosts(2, tmp_path_factory.mktemp("ssh-hosts"), max_sessions=4) as hosts:
        yield hosts
