"""Real upstream instances (jinja2 3.1.3->3.1.4: pytest, src-layout installed with pip, MarkupSafe from pip,
parametrised ids with whitespace; more-itertools 10.3.0->10.4.0: unittest, flat), brought in as a user brings
SWE-bench instances (JSONL + a repos dir whose clones hold the fix as a later commit + env specs): the gold patch
resolves and the empty patch does not, on docker and on bwrap, through the CLI; the images are cached."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
JINJA = "pallets__jinja-xmlattr-keys"
MORE = "more-itertools__more-itertools-unsortable-permutations"


def _cli(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "agentrl.cli", "eval", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout)


def _flags(up: Path) -> list[str]:
    return ["--instances", str(up / "instances.jsonl"), "--repos-dir", str(up / "repos"),
            "--env-specs", str(up / "env_specs.yaml")]


def test_recipes_build_swebench_instances_with_history(upstream):
    from agentrl.envs.swe.instances import load_instances
    from agentrl.envs.swe.repos import git

    raw = [json.loads(line) for line in (upstream / "instances.jsonl").read_text().splitlines()]
    assert all(isinstance(r["FAIL_TO_PASS"], str) for r in raw)  # JSON strings, as SWE-bench stores them
    insts = {i.instance_id: i for i in load_instances(upstream / "instances.jsonl")}
    assert set(insts) == {JINJA, MORE}
    jinja = insts[JINJA]
    assert "tests/test_filters.py::TestFilter::test_xmlattr_key_invalid[ ]" in jinja.FAIL_TO_PASS
    clone = upstream / "repos" / "pallets__jinja"
    log = git("log", "--format=%H %s", "main", cwd=clone).splitlines()
    assert log[1] == f"{jinja.base_commit} Jinja2 3.1.3" and log[0].endswith("Jinja2 3.1.4")  # the fix is in the future
    assert jinja.patch.startswith("diff --git a/src/jinja2/filters.py") and "_attr_key_re" in jinja.patch


@pytest.mark.docker
def test_gold_resolves_empty_does_not_on_docker_through_the_cli(upstream, docker_ready, tmp_path):
    out = tmp_path / "v.json"
    r = _cli("validate-swe", *_flags(upstream), "--backend", "docker", "--json", str(out))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    rows = {x["instance_id"]: x for x in json.loads(out.read_text())["rows"]}
    assert set(rows) == {JINJA, MORE} and all(x["ok"] for x in rows.values())
    assert rows[JINJA]["gold"]["runner"] == "pytest" and rows[MORE]["gold"]["runner"] == "unittest"
    assert set(rows[JINJA]["empty"]["fail_to_pass"].values()) == {"fail"}


@pytest.mark.bwrap
async def test_gold_resolves_empty_does_not_on_bwrap_and_images_are_cached(upstream, bwrap_ready):
    import time

    from agentrl.envs.swe.envspec import EnvSpecs
    from agentrl.envs.swe.images import ImageBuilder
    from agentrl.envs.swe.instances import load_instances
    from agentrl.envs.swe.repos import RepoStore
    from agentrl.envs.swe.validate import validate_instances
    from agentrl.sandboxes import SandboxSpec

    insts = load_instances(upstream / "instances.jsonl")
    spec = SandboxSpec(backend="bwrap")
    rows = await validate_instances(insts, spec=spec, repo_store=RepoStore(upstream / "repos"),
                                    env_specs=EnvSpecs.load(upstream / "env_specs.yaml"))
    assert [r.ok for r in rows] == [True, True], [r.problems for r in rows]
    # a second builder finds every layer built: preparing is a lookup
    again = ImageBuilder(spec, RepoStore(upstream / "repos"), EnvSpecs.load(upstream / "env_specs.yaml"))
    t0 = time.monotonic()
    rt = again.prepare(insts[0])
    assert time.monotonic() - t0 < 5 and rt.sandbox.mounts and rt.env_spec.install


@pytest.mark.docker
def test_eval_honours_swe_flags_and_writes_predictions_swebench_loads(upstream, docker_ready, swebench_check, tmp_path):
    out = tmp_path / "run"
    r = _cli("--env", "swe", *_flags(upstream), "--ids", JINJA, "--backend", "docker", "--policy", "oracle",
             "--name", "gold-model", "--out", str(out), "--no-progress")
    assert r.returncode == 0, r.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    assert report["total"]["n"] == 1 and report["total"]["success"] == 1  # the file's instance, not the suite
    preds = [json.loads(x) for x in (out / "predictions.jsonl").read_text().splitlines()]
    assert [p["instance_id"] for p in preds] == [JINJA] and "_attr_key_re" in preds[0]["model_patch"]
    checked = swebench_check(out / "predictions.jsonl", upstream / "instances.jsonl")
    assert checked["to_run"] == [JINJA] and sorted(checked["dataset"]) == sorted([JINJA, MORE])
    assert checked["missing_fields"] == []  # the instances carry every field of swebench's SWEbenchInstance
