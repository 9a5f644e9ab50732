"""Rate-limit accuracy (issue 31): a key driven far over its tokens-per-minute gets 429s,
and what it is served stays within 1 % of its limit; another key beside it is unaffected.

    python benchmarks/rate_limits.py [--seconds 60] [--tpm 30000]
                                     [--out benchmarks/results/rate_limits.json]

One mocker worker process and one frontend with a key file of two keys: ``greedy``
(``tokens_per_minute: TPM``) whose closed-loop clients ask for about three times its
limit, sleeping each 429's ``retry-after-ms`` as OpenAI's clients do, and ``other``
(unlimited, two sessions). Phases: ``other`` alone, then both for ``--seconds``.

Measured: the prompt plus completion tokens (each answer's ``usage``) served to
``greedy``. Its bucket starts full (one minute's worth), so over T seconds it may be
served ``TPM * (1 + T / 60)``; the error is the tokens served beyond (or short of) that,
over the ``TPM * T / 60`` the window refills. The same error is given for the window from
its first 429 (its bucket empty) to the end, against ``TPM`` per minute alone. ``other``:
its 429s (0 expected) and its latency p50 beside ``greedy`` over alone.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from cluster import MODEL, NS, _frontend_url, _wait_workers
from machine import machine

KEYS = """\
keys:
  - {name: greedy, key: sk-bench-greedy, limits: {tokens_per_minute: %d}}
  - {name: other, key: sk-bench-other}
"""
GREEDY_CLIENTS, OTHER_CLIENTS, WORDS, MAX_TOKENS = 4, 2, 40, 40


class Client:
    """One key's closed-loop sessions and what they saw."""

    def __init__(self, http: httpx.AsyncClient, url: str, key: str) -> None:
        self.http, self.url = http, url
        self.headers = {"Authorization": f"Bearer {key}"}
        self.served: list[tuple[float, float, int]] = []
        """(start, end, prompt + completion tokens) of every answered request."""
        self.refused: list[float] = []
        """When each 429 came."""
        self.errors = 0

    async def session(self, index: int, stop: float) -> None:
        turn = 0
        while time.monotonic() < stop:
            turn += 1
            body = {"model": MODEL, "prompt": f"session {index} turn {turn} " + "word " * WORDS,
                    "max_tokens": MAX_TOKENS, "ignore_eos": True}  # fmt: skip
            start = time.monotonic()
            try:
                resp = await self.http.post(
                    f"{self.url}/v1/completions", json=body, headers=self.headers
                )
            except httpx.HTTPError:
                self.errors += 1
                await asyncio.sleep(0.1)
                continue
            if resp.status_code == 429:
                self.refused.append(start)
                # As OpenAI's client: retry-after-ms first, then Retry-After.
                wait_ms = resp.headers.get("retry-after-ms")
                wait = float(wait_ms) / 1000 if wait_ms else float(resp.headers["retry-after"])
                await asyncio.sleep(wait)
                continue
            if resp.status_code != 200:
                self.errors += 1
                continue
            usage = resp.json()["usage"]
            self.served.append(
                (start, time.monotonic(), usage["prompt_tokens"] + usage["completion_tokens"])
            )


def p50_ms(client: Client) -> float | None:
    took = sorted(end - start for start, end, _ in client.served)
    return round(1000 * took[len(took) // 2], 1) if took else None


async def measure(url: str, tpm: int, seconds: float) -> dict[str, Any]:
    async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=32)) as http:
        alone = Client(http, url, "sk-bench-other")
        stop = time.monotonic() + min(10.0, seconds)
        await asyncio.gather(*(alone.session(i, stop) for i in range(OTHER_CLIENTS)))
        greedy = Client(http, url, "sk-bench-greedy")
        other = Client(http, url, "sk-bench-other")
        t0 = time.monotonic()
        stop = t0 + seconds
        await asyncio.gather(
            *(greedy.session(i, stop) for i in range(GREEDY_CLIENTS)),
            *(other.session(100 + i, stop) for i in range(OTHER_CLIENTS)),
        )
    rate = tpm / 60.0
    served = sum(tokens for start, _, tokens in greedy.served if start < stop)
    allowed = tpm + rate * seconds
    first_429 = min(greedy.refused) if greedy.refused else None
    steady: dict[str, Any] = {}
    if first_429 is not None:
        window = stop - first_429
        in_window = sum(tokens for start, _, tokens in greedy.served if start >= first_429)
        steady = {
            "window_s": round(window, 2),
            "tokens_served": in_window,
            "tokens_per_minute": round(in_window / window * 60, 1),
            "error": round(in_window / (rate * window) - 1, 4),
        }
    return {
        "greedy": {
            "tpm_limit": tpm,
            "tokens_served": served,
            "tokens_allowed": round(allowed),
            "error": round((served - allowed) / (rate * seconds), 4),
            "requests_served": len(greedy.served),
            "requests_429": len(greedy.refused),
            "first_429_s": None if first_429 is None else round(first_429 - t0, 2),
            "after_first_429": steady,
            "errors": greedy.errors,
        },
        "other": {
            "requests_served": len(other.served),
            "requests_429": len(other.refused),
            "errors": other.errors,
            "latency_p50_alone_ms": p50_ms(alone),
            "latency_p50_beside_greedy_ms": p50_ms(other),
        },
    }


async def run(tpm: int, seconds: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "keys.yaml").write_text(KEYS % tpm)
        discovery = f"embedded://{tmp}/disc"
        common = ["--namespace", NS, "--discovery", discovery]
        procs = [await asyncio.create_subprocess_exec(
            sys.executable, "-m", "dynamoctl", "worker", "--model", MODEL, "--block-size", "16",
            "--num-workers", "2", "--speedup-ratio", "10", *common,
            stderr=asyncio.subprocess.DEVNULL)]  # fmt: skip
        try:
            await _wait_workers(discovery, 2)
            procs.append(await asyncio.create_subprocess_exec(
                sys.executable, "-m", "dynamoctl", "frontend", "--port", "0",
                "--api-keys-file", f"{tmp}/keys.yaml", *common,
                stderr=asyncio.subprocess.DEVNULL))  # fmt: skip
            url = await _frontend_url(discovery)
            async with httpx.AsyncClient() as http:
                for _ in range(600):  # the model is served once the frontend saw a worker
                    models = await http.get(
                        f"{url}/v1/models", headers={"Authorization": "Bearer sk-bench-other"}
                    )
                    if MODEL in models.text:
                        break
                    await asyncio.sleep(0.2)
            return await measure(url, tpm, seconds)
        finally:
            for proc in procs:
                proc.terminate()
            for proc in procs:
                await proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--tpm", type=int, default=30000)
    parser.add_argument("--out", default="benchmarks/results/rate_limits.json")
    args = parser.parse_args()
    result = {
        **asyncio.run(run(args.tpm, args.seconds)),
        "machine": machine(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "deployment": "1 worker process x 2 mocker instances (--speedup-ratio 10), 1 frontend",
        "workload": f"greedy: {GREEDY_CLIENTS} closed-loop sessions, ~{WORDS + 4}-word prompts, "
        f"{MAX_TOKENS} tokens, each 429's retry-after-ms slept; other: {OTHER_CLIENTS} sessions "
        f"alike, unlimited; {args.seconds} s",
        "goal": "greedy's |error| <= 0.01 (tokens served beyond or short of TPM * (1 + T/60), "
        "over TPM * T/60); other's requests_429 == 0",
    }
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("greedy", "other")}, indent=1))


if __name__ == "__main__":
    main()
