"""SGLang's follower side of a multi-node replica, without SGLang (a GPU engine this
machine does not install): the server arguments a follower hands ``sglang.Engine`` (the
leader's translation, node rank >= 1, no KV publisher of its own), the refusal of a
command that is no follower's, the gang network it names, and ``dynamoctl follower
--engine sglang`` bounded by its rendezvous timeout. That the arguments start SGLang's
schedulers is not verified here (docs/engines.md, "Multi-node replicas")."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import pytest

from dynamoctl.engines.sglang.gang import follower_server_args, is_gang, set_network_env
from tests.infra.ports import free_port

pytestmark = pytest.mark.gang

FOLLOWER = [
    *("--model", "/m", "--block-size", "32", "--tp", "16"),
    *("--nnodes", "2", "--node-rank", "1", "--dist-init-addr", "10.0.0.1:29501"),
    *("--host", "10.0.0.2", "--port", "30000"),
]


def _follower(argv: list[str], rendezvous: str, timeout: float) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "dynamoctl", "follower", "--engine", "sglang"]
    command += ["--label", "agg-0.1", "--rendezvous", rendezvous]
    command += ["--rendezvous-timeout", str(timeout), "--", *argv]
    return subprocess.Popen(command, stderr=subprocess.PIPE, text=True)


def test_a_follower_gets_the_leaders_server_arguments_with_its_rank() -> None:
    args = follower_server_args(FOLLOWER)
    assert args["model_path"] == "/m" and args["page_size"] == 32 and args["tp_size"] == 16
    assert "tp" not in args  # ServerArgs has tp_size only (the CLI's --tp is an alias)
    assert (args["nnodes"], args["node_rank"], args["dist_init_addr"]) == (
        2,
        1,
        "10.0.0.1:29501",
    )
    assert (args["host"], args["port"]) == ("10.0.0.2", 30000)  # its dummy health check
    assert args["skip_tokenizer_init"] is True  # as the leader, which feeds token ids
    assert "kv_events_config" not in args and args["log_level"] == "info"


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (("--node-rank", "0"), "node rank 0 of 2"),
        (("--node-rank", "2"), "node rank 2 of 2"),
        (("--dist-init-addr", ""), "needs --dist-init-addr"),
    ],
)
def test_a_command_that_is_no_followers_is_refused(change: tuple[str, str], says: str) -> None:
    argv = list(FOLLOWER)
    argv[argv.index(change[0]) + 1] = change[1]
    if not change[1]:
        argv.remove(change[0])
        argv.remove("")
    with pytest.raises(ValueError, match=says):
        follower_server_args(argv)


def test_members_name_the_interface_of_their_sglang_host_ip() -> None:
    env = {"SGLANG_HOST_IP": "127.0.0.1"}
    assert set_network_env(env) == {"GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "lo"}
    env = {"SGLANG_HOST_IP": "127.0.0.1", "NCCL_SOCKET_IFNAME": "ib0"}  # the operator's wins
    assert (
        set_network_env(env) == {"GLOO_SOCKET_IFNAME": "lo"} and env["NCCL_SOCKET_IFNAME"] == "ib0"
    )
    assert is_gang({"nnodes": 2}) and not is_gang({"tp": 8}) and not is_gang({"nnodes": "1"})


def test_the_follower_command_refuses_a_bad_rank_before_waiting() -> None:
    argv = list(FOLLOWER)
    argv[argv.index("--node-rank") + 1] = "0"
    began = time.monotonic()
    proc = _follower(argv, f"127.0.0.1:{free_port()}", timeout=60)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and "node rank 0 of 2" in err
    assert time.monotonic() - began < 30  # never waited its 60 s for the leader


def test_an_unreachable_leader_ends_an_sglang_follower_with_status_2_in_bound() -> None:
    port = free_port()  # nothing listens there
    began = time.monotonic()
    proc = _follower(FOLLOWER, f"127.0.0.1:{port}", timeout=1)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2
    assert f"agg-0.1 on {socket.gethostname()}: cannot reach the leader's rendezvous" in err
    assert f"127.0.0.1:{port} within 1 s (connection refused)" in err
    assert time.monotonic() - began < 30


def test_every_parallel_size_spelling_the_gang_rules_accept_reaches_the_engine() -> None:
    """The rules accept several spellings (each engine's spec.py); each adapter must hand
    its engine the one its Python API takes (``ServerArgs.tp_size``, ``LLM``'s
    ``tensor_parallel_size``), or a valid recipe would fail at start."""
    from dynamoctl.engines.registry import engine_spec
    from dynamoctl.engines.sglang.args import server_args
    from dynamoctl.engines.trtllm.args import llm_kwargs

    wanted = {
        "sglang": ({"tp_size", "pp_size"}, lambda o: server_args(o, None)),
        "trtllm": ({"tensor_parallel_size", "pipeline_parallel_size"}, llm_kwargs),
    }
    for engine, (fields, translate) in wanted.items():
        for spellings in engine_spec(engine).parallel_sizes:
            for spelling in spellings:
                out = translate({"model": "/m", spelling.replace("-", "_"): 2})
                assert set(out) & fields, (engine, spelling, out)
