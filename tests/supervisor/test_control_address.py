"""Where the supervisor's control endpoint listens and the URL it records and registers
(the planner on the head host and ``status`` on a login node use it): a name that would
send other hosts to a loopback address, or elsewhere than this machine, is replaced by
the address this machine reaches the head host from."""

from __future__ import annotations

import socket

import pytest

from dynamoctl.recipe.loader import load_recipe_text
from dynamoctl.recipe.models import Recipe
from dynamoctl.supervisor.control import control_address
from dynamoctl.util.net import source_address

BASE = """\
schema: 1
name: ctl
model: {name: m, path: m}
workers:
  agg: {engine: mocker, gpus_per_replica: 0}
"""
SSH = "target: {kind: ssh, hosts: [gpu-a], addresses: {gpu-a: 192.0.2.1}}\n"


def recipe(*parts: str) -> Recipe:
    return load_recipe_text(BASE + "".join(parts), "r.yaml")


def test_local_and_explicit_hosts_are_used_as_given() -> None:
    assert control_address(recipe()) == ("127.0.0.1", "127.0.0.1")
    given = recipe(SSH, "supervision: {control_host: 10.1.2.3}\n")
    assert control_address(given, "192.0.2.1") == ("10.1.2.3", "10.1.2.3")


def test_the_machine_name_is_kept_only_where_it_leads_back_here(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ssh = recipe(SSH)
    # "localhost" resolves to 127.0.0.1, the address this machine reaches 127.0.0.1 from.
    monkeypatch.setattr(socket, "gethostname", lambda: "localhost")
    assert control_address(ssh, "127.0.0.1") == ("0.0.0.0", "localhost")
    # A name that does not resolve (or resolves elsewhere): the address toward the head.
    monkeypatch.setattr(socket, "gethostname", lambda: "nowhere.invalid")
    assert control_address(ssh, "127.0.0.1") == ("0.0.0.0", "127.0.0.1")
    # No route to the head (a symbolic Slurm node in a dry run): the name, as before.
    assert control_address(ssh, "<node>") == ("0.0.0.0", "nowhere.invalid")
    assert control_address(ssh) == ("0.0.0.0", "nowhere.invalid")


def test_source_address_is_the_kernels_choice() -> None:
    assert source_address("127.0.0.1") == "127.0.0.1"
    assert source_address("not an address") is None
