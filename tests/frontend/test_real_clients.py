"""Real clients against a mocker deployment, as users run them (docs/api.md, "Clients
tested"): guidellm 0.8.1 with its defaults (a short sweep, over chat and over text
completions: it streams with ``stream_options.continuous_usage_stats``), and
lm-evaluation-harness 0.4.13's ``local-completions`` on a tiny multiple-choice task
(``echo`` with ``logprobs``) and a ``generate_until`` task, written here, without a local
tokenizer (it finds ``/tokenizer_info`` and uses ``/tokenize``). Nothing is downloaded:
the data is local, the hub is off.

Both tools live in their own virtual environment (scripts/install-deps.sh makes it, from
the ``clients`` extra): they pin older ``click`` and ``multidict`` than ours.
"""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import pytest_asyncio

import dynamoctl.tokenizer
from tests.frontend.conftest import MODEL, Deployment, two_workers
from tests.frontend.test_refusals import requests_total

pytestmark = [
    pytest.mark.openai_compat,
    pytest.mark.asyncio(loop_scope="module"),
    pytest.mark.timeout(600),
]

VENV = Path(os.environ.get("DYNAMOCTL_CLIENTS_VENV", Path.home() / ".cache/dynamoctl/clients"))
"""Where scripts/install-deps.sh installs the clients."""
BUILTIN_DIR = Path(dynamoctl.tokenizer.__file__).parent / "builtin"
"""The mocker's tokenizer (its model card's ``builtin``), as guidellm loads one: a directory."""
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
SMALL = {"GUIDELLM__MAX_WORKER_PROCESSES": "2"}
"""guidellm spawns up to 10 worker processes per strategy, each importing it anew: two
are plenty for 12 requests on a 2-core machine (what it sends is unchanged)."""


def tool(name: str) -> Path:
    path = VENV / "bin" / name
    if path.exists():
        return path
    why = f"{name} is not installed in {VENV} (scripts/install-deps.sh installs it)"
    if os.environ.get("CI") or os.environ.get("DYNAMOCTL_REQUIRE_CLIENTS"):
        pytest.fail(why, pytrace=False)
    pytest.skip(why)


def run(args: list[str | Path], cwd: Path, timeout: float) -> str:
    env = {**os.environ, **OFFLINE, **SMALL}
    env.pop("PYTHONPATH", None)  # the tools' own environment, not the repository's
    done = subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)  # fmt: skip
    assert done.returncode == 0, f"{args[0]} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout + done.stderr


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def dep(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Deployment]:
    async with two_workers(tmp_path_factory.mktemp("clients")) as dep:
        yield dep


async def counts(dep: Deployment) -> dict[tuple[str, str, str], float]:
    async with httpx.AsyncClient(base_url=dep.frontend_url, timeout=30) as http:
        return requests_total((await http.get("/metrics")).text)


@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v1/completions"])
async def test_guidellm_sweep_with_its_defaults(
    dep: Deployment, tmp_path: Path, route: str
) -> None:
    endpoint = "chat" if "chat" in route else "completions"
    before = await counts(dep)
    run([tool("guidellm"), "run",
         "--backend", f"kind=openai_http,target={dep.frontend_url},request_format={route}",
         "--profile", "kind=sweep,sweep_size=3",
         "--data", "kind=synthetic_text,prompt_tokens=64,output_tokens=16",
         "--tokenizer", f"kind=huggingface_auto,model={BUILTIN_DIR}",  # the model's own
         "--constraint", "kind=max_requests,count=12",
         "--disable-console-interactive"], tmp_path, timeout=420)  # fmt: skip
    report = json.loads((tmp_path / "benchmarks.json").read_text())
    benchmarks = report["benchmarks"]
    assert len(benchmarks) == 3  # synchronous, throughput and one constant rate
    for bench in benchmarks:
        totals = bench["scheduler_metrics"]["requests_made"]
        assert totals["errored"] == 0 and totals["incomplete"] == 0, totals
        assert totals["successful"] == 12
        outputs = bench["metrics"]["output_token_count"]["successful"]
        assert outputs["min"] == outputs["max"] == 16  # the usage it read in every chunk
        sent = json.loads(bench["requests"]["successful"][0]["request_args"])["body"]
        assert sent["stream_options"]["continuous_usage_stats"] is True
    after = await counts(dep)
    served = after[(MODEL, endpoint, "200")] - before.get((MODEL, endpoint, "200"), 0)
    assert served >= 36
    assert not [k for k in after if k[2] != "200" and after[k] > before.get(k, 0)], after


MC = [
    {"question": f"What is {a} plus {b}?", "choices": [str(a + b), str(a + b + 1), "seven"],
     "answer": 0}
    for a, b in [(1, 2), (3, 4), (5, 6), (7, 8), (2, 2), (9, 1)]
]  # fmt: skip
GEN = [{"question": f"Name colour number {i}.", "answer": "blue"} for i in range(5)]
TASK = """\
task: {name}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: {kind}
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_target: "{{{{answer}}}}"
metric_list:
  - metric: {metric}
    aggregation: mean
    higher_is_better: true
"""


def write_tasks(folder: Path) -> None:
    for name, rows, kind, metric, extra in (
        ("dynamoctl_mc", MC, "multiple_choice", "acc", 'doc_to_choice: "{{choices}}"\n'),
        ("dynamoctl_gen", GEN, "generate_until", "exact_match",
         'generation_kwargs:\n  until: ["\\n"]\n  max_gen_toks: 16\n'),
    ):  # fmt: skip
        data = folder / f"{name}.jsonl"
        data.write_text("".join(json.dumps(row) + "\n" for row in rows))
        text = TASK.format(name=name, data=data, kind=kind, metric=metric) + extra
        (folder / f"{name}.yaml").write_text(textwrap.dedent(text))


async def test_lm_eval_local_completions_without_a_tokenizer(
    dep: Deployment, tmp_path: Path
) -> None:
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    write_tasks(tasks)
    before = await counts(dep)
    url = f"{dep.frontend_url}/v1/completions"
    log = run([tool("lm_eval"), "run", "--model", "local-completions",
               "--model_args", f"model={MODEL},base_url={url},num_concurrent=2,max_retries=1",
               "--tasks", "dynamoctl_mc,dynamoctl_gen", "--include_path", tasks,
               "--batch_size", "8", "--output_path", tmp_path / "out", "--log_samples"],
              tmp_path, timeout=420)  # fmt: skip
    assert "Using remote tokenizer" in log
    found = list((tmp_path / "out").rglob("results_*.json"))
    assert len(found) == 1, found
    results = json.loads(found[0].read_text())
    assert 0.0 <= results["results"]["dynamoctl_mc"]["acc,none"] <= 1.0
    assert 0.0 <= results["results"]["dynamoctl_gen"]["exact_match,none"] <= 1.0
    assert results["n-samples"]["dynamoctl_mc"]["effective"] == len(MC)
    assert results["n-samples"]["dynamoctl_gen"]["effective"] == len(GEN)
    samples = next((tmp_path / "out").rglob("samples_dynamoctl_mc_*.jsonl")).read_text()
    scored = [json.loads(line) for line in samples.splitlines()]
    # A log-likelihood per choice, from the prompt log-probabilities echo returns.
    assert all(len(s["filtered_resps"]) == 3 for s in scored)
    assert all(float(r[0]) < 0 for s in scored for r in s["filtered_resps"])
    after = await counts(dep)

    def new(endpoint: str, status: str = "200") -> float:
        key = (MODEL, endpoint, status)
        return after.get(key, 0) - before.get(key, 0)

    assert new("tokenize") >= 1 and new("completions") >= 2  # its remote tokenizer, then work
    assert not [k for k in after if k[2] != "200" and after[k] > before.get(k, 0)], after
