"""Running the real ``dynamoctl`` CLI against a throwaway run-directory home."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import psutil
import pytest

from tests.infra.ports import free_port as free_port  # what the tests here import

REPO = Path(__file__).resolve().parents[2]


def mocker_recipe(name: str, port: int, replicas: int = 2, extra: str = "") -> str:
    return f"""\
schema: 1
name: {name}
model: {{name: mock-llama, path: mock-llama, block_size: 16}}
frontend: {{port: {port}}}
workers:
  agg:
    engine: mocker
    replicas: {replicas}
    gpus_per_replica: 0
    engine_args: {{num-gpu-blocks: 1024, speedup-ratio: 10}}
supervision:
  probe_interval: 0.3
  backoff_base: 0.2
  hang_timeout: 4
  drain_timeout: 20
{extra}"""


@dataclass
class Cli:
    home: Path
    tmp: Path

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "DYNAMOCTL_HOME": str(self.home)}

    def __call__(self, *args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "dynamoctl", *args],
            cwd=REPO,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def recipe(self, text: str, name: str = "recipe.yaml") -> Path:
        path = self.tmp / name
        path.write_text(text)
        return path

    def status(self, name: str | None = None) -> dict[str, Any]:
        result = self("status", "--json", *([name] if name else []))
        assert result.returncode == 0, result.stderr
        return json.loads(result.stdout)  # type: ignore[no-any-return]

    def wait_for(self, predicate: Any, timeout: float = 30.0, what: str = "") -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            report = self.status()
            if predicate(report):
                return report
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}: {report}")
            time.sleep(0.3)


def completions_until(
    base_url: str,
    stop: threading.Event,
    errors: list[str],
    done: list[int],
    most: int = 400,
    timeout: float = 30.0,
    prompt: Callable[[], str] = lambda: "hello " * 30,
) -> None:
    """A client thread's load: 16-token completions of ``prompt()`` until ``stop`` or
    ``most`` are done (bounded in count and time); each success appended to ``done``, each
    failure to ``errors``."""
    client = openai.OpenAI(base_url=base_url, api_key="none", max_retries=0, timeout=timeout)
    while not stop.is_set() and len(done) < most:
        try:
            out = client.completions.create(
                model="mock-llama", prompt=prompt(), max_tokens=16,
                extra_body={"ignore_eos": True},
            )  # fmt: skip
            assert out.usage is not None and out.usage.completion_tokens == 16
            done.append(1)
        except Exception as exc:
            errors.append(repr(exc))


def states(report: dict[str, Any]) -> dict[str, str]:
    return {row["name"]: row["state"] for row in report["instances"]}


def live_in_group(pgid: int) -> list[int]:
    """Non-zombie processes in process group ``pgid``."""
    found = []
    for proc in psutil.process_iter(["status"]):
        try:
            if proc.info["status"] != psutil.STATUS_ZOMBIE and os.getpgid(proc.pid) == pgid:
                found.append(proc.pid)
        except (OSError, psutil.Error):
            continue
    return found


@pytest.fixture
def cli(tmp_path: Path) -> Iterator[Cli]:
    cli = Cli(home=tmp_path / "home", tmp=tmp_path)
    try:
        yield cli
    finally:
        # Whatever a failed test left: stop every deployment it started.
        runs = cli.home / "runs"
        for run in runs.iterdir() if runs.is_dir() else []:
            cli("down", run.name, "--now", timeout=60)
