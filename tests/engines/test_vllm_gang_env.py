"""The network environment a vLLM gang member sets for itself at start
(:func:`dynamoctl.engines.vllm.gang.set_network_env`): the interface that holds its
``VLLM_HOST_IP``, looked up on the node. No vLLM needed."""

from __future__ import annotations

import pytest

from dynamoctl.engines.vllm.gang import interface_of, is_gang, set_network_env

pytestmark = pytest.mark.gang


def test_the_interface_holding_the_members_address_is_named_for_gloo_and_nccl() -> None:
    assert interface_of("127.0.0.1") == "lo"
    env = {"VLLM_HOST_IP": "127.0.0.1"}
    assert set_network_env(env) == {"GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "lo"}
    assert env["GLOO_SOCKET_IFNAME"] == env["NCCL_SOCKET_IFNAME"] == "lo"


def test_an_operators_value_is_kept_and_an_unknown_address_sets_nothing() -> None:
    env = {"VLLM_HOST_IP": "127.0.0.1", "GLOO_SOCKET_IFNAME": "ib0"}
    assert set_network_env(env) == {"NCCL_SOCKET_IFNAME": "lo"}
    assert env["GLOO_SOCKET_IFNAME"] == "ib0"
    for address in ("192.0.2.77", "not-an-address", ""):
        env = {"VLLM_HOST_IP": address} if address else {}
        assert set_network_env(env) == {} and "GLOO_SOCKET_IFNAME" not in env
    assert interface_of("192.0.2.77") is None


def test_only_multi_node_engine_options_make_a_gang() -> None:
    assert is_gang({"nnodes": 2, "node_rank": 0})
    assert is_gang({"data_parallel_size_local": 4})
    assert not is_gang({"tensor_parallel_size": 2}) and not is_gang({"nnodes": "1"})
