"""Refused requests are counted by status in ``/metrics`` and logged, rate-limited and
without their body (docs/metrics.md, docs/api.md "Errors")."""

from __future__ import annotations

import logging
import re

import httpx
import pytest

from dynamoctl.frontend.errors import bad_request
from dynamoctl.frontend.refusals import RefusalLog
from tests.frontend.conftest import MODEL, Deployment

pytestmark = pytest.mark.openai_compat

SECRET = "do-not-log-this-body-7f3a"


def requests_total(metrics: str) -> dict[tuple[str, str, str], float]:
    """``(model, endpoint, status) -> count`` of ``dynamoctl_frontend_requests_total``."""
    found = {}
    for line in metrics.splitlines():
        if line.startswith("dynamoctl_frontend_requests_total{"):
            labels = dict(re.findall(r'(\w+)="([^"]*)"', line))
            key = (labels["model"], labels["endpoint"], labels["status"])
            found[key] = float(line.rsplit(" ", 1)[1])
    return found


async def test_refused_requests_are_counted_by_status_and_logged(
    deployment: Deployment,
) -> None:
    url = deployment.frontend_url
    async with httpx.AsyncClient(timeout=30) as http:
        unknown = await http.post(f"{url}/v1/completions",
                                  json={"model": MODEL, "prompt": SECRET, "bogus": 1})  # fmt: skip
        assert unknown.status_code == 400 and unknown.json()["error"]["param"] == "bogus"
        not_json = await http.post(f"{url}/v1/chat/completions", content=b"{" + SECRET.encode())
        assert not_json.status_code == 400
        no_model = await http.post(f"{url}/v1/completions", json={"model": "nope", "prompt": "x"})
        assert no_model.status_code == 404
        missing = await http.post(
            f"{url}/v1/images/generations", json={"model": MODEL, "prompt": "x"}
        )
        assert missing.status_code == 404
        ok = await http.post(f"{url}/v1/completions",
                             json={"model": MODEL, "prompt": "x", "max_tokens": 2})  # fmt: skip
        assert ok.status_code == 200
        counts = requests_total((await http.get(f"{url}/metrics")).text)
    assert counts[("", "completions", "400")] == 1
    assert counts[("", "chat", "400")] == 1
    assert counts[("", "completions", "404")] == 1
    assert counts[("", "other", "404")] == 1  # the path is the client's: not a label
    assert counts[(MODEL, "completions", "200")] == 1
    log = (deployment.tmp / "frontend.log").read_text()
    assert "refused POST /v1/completions: 400 invalid_request_error (param bogus)" in log
    assert "refused POST /v1/images/generations: 404" in log
    assert SECRET not in log


def test_refusal_log_is_rate_limited(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    lines = RefusalLog(burst=3, window=10, clock=lambda: now[0])
    error = bad_request("no", "n")
    with caplog.at_level(logging.WARNING, logger="dynamoctl.frontend.refusals"):
        logged = [lines.refused("POST /v1/completions", error) for _ in range(10)]
        assert logged == [True] * 3 + [False] * 7
        now[0] = 10.5  # the next window: the dropped are summed up, then logging resumes
        assert lines.refused("POST /v1/completions", error)
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 5
    assert "7 more refused requests were not logged in 10 s" in messages[3]
    assert messages[0] == "refused POST /v1/completions: 400 invalid_request_error (param n): no"
