"""`tailkit repro --jobs N`: the stage graph, its jobs, their order and threads, and a DVC
project reproduced with two stages that can only finish if they run at the same time."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tailkit.pipeline import parallel_repro as pr

# The default pipeline's shape: a chain at the head, feature sets, a sampler fit, then one
# train → evaluate pair per experiment, and a report over all of them.
DOT = """strict digraph {
"fingerprint";
"download";
"subsample";
"featurize@a";
"featurize@b";
"fit-sampler";
"train@x";
"train@y";
"evaluate@x";
"evaluate@y";
"report";
"fingerprint" -> "download";
"fingerprint" -> "subsample";
"download" -> "subsample";
"subsample" -> "featurize@a";
"subsample" -> "featurize@b";
"download" -> "featurize@a";
"download" -> "featurize@b";
"featurize@a" -> "fit-sampler";
"featurize@b" -> "fit-sampler";
"fit-sampler" -> "train@x";
"featurize@a" -> "train@x";
"fit-sampler" -> "train@y";
"featurize@b" -> "train@y";
"train@x" -> "evaluate@x";
"fit-sampler" -> "evaluate@x";
"featurize@a" -> "evaluate@x";
"train@y" -> "evaluate@y";
"fit-sampler" -> "evaluate@y";
"evaluate@x" -> "report";
"evaluate@y" -> "report";
"train@x" -> "report";
}
"""


def _jobs(seconds=lambda stage: 1.0) -> list[pr.Job]:
    stages, upstream = pr.parse_dot(DOT)
    return pr.group_jobs(stages, upstream, seconds)


def test_the_graph_is_read_from_dvc_dag_dot() -> None:
    stages, upstream = pr.parse_dot(DOT)
    assert stages[:3] == ["fingerprint", "download", "subsample"] and len(stages) == 11
    assert upstream["evaluate@x"] == {"train@x", "fit-sampler", "featurize@a"}
    assert upstream["fingerprint"] == set()
    with pytest.raises(pr.ReproError, match="did not list"):
        pr.parse_dot('strict digraph {\n"a";\n"a" -> "b";\n}')


def test_chains_become_jobs_and_the_experiments_stay_apart() -> None:
    jobs = _jobs()
    names = [job.stages for job in jobs]
    assert names == [
        ["fingerprint", "download", "subsample"],
        ["featurize@a"],
        ["featurize@b"],
        ["fit-sampler"],
        ["train@x", "evaluate@x"],
        ["train@y", "evaluate@y"],
        ["report"],
    ]
    assert jobs[3].needs == {1, 2} and jobs[4].needs == {1, 3} and jobs[6].needs == {4, 5}


def test_a_cycle_is_refused() -> None:
    with pytest.raises(pr.ReproError, match="cycle"):
        pr.topological(["a", "b"], {"a": {"b"}, "b": {"a"}})


def test_the_longest_chain_of_work_goes_first() -> None:
    jobs = _jobs(lambda stage: 50.0 if stage == "train@y" else 1.0)
    priority = pr.critical_seconds(jobs)
    assert priority[5] == 50 + 1 + 1  # train@y + evaluate@y, then the report
    assert priority[5] > priority[4]


def test_recorded_training_seconds_set_the_expected_cost(tmp_path: Path) -> None:
    (tmp_path / "metrics/timings/train").mkdir(parents=True)
    (tmp_path / "metrics/timings/train/x.json").write_text(json.dumps({"seconds": 40.0}))
    (tmp_path / "metrics/timings/fit-sampler").mkdir(parents=True)
    (tmp_path / "metrics/timings/fit-sampler/tree.json").write_text('{"fit_seconds": 30.0}')
    seconds = pr.recorded_seconds(tmp_path)
    assert seconds("train@x") == 40 + pr.STAGE_OVERHEAD
    assert seconds("fit-sampler@tree") == 30 + pr.DEFAULT_SECONDS
    assert seconds("fit-sampler@uniform") == pr.DEFAULT_SECONDS
    assert seconds("train@y") == pr.DEFAULT_SECONDS + pr.STAGE_OVERHEAD
    assert seconds("report") == pr.DEFAULT_SECONDS


def _recording_launcher(tmp_path: Path, fail: str | None = None):
    """Each job appends its stages and thread count to a log; ``fail`` exits 3."""
    log = tmp_path / "launched.jsonl"

    def launch(stages, env, out):
        record = json.dumps({"stages": stages, "threads": env["OMP_NUM_THREADS"]})
        code = 3 if fail in stages else 0
        script = (
            f"import sys; open({str(log)!r}, 'a').write({record!r} + '\\n'); "
            f"print('ran', {stages!r}); sys.exit({code})"
        )
        with out.open("wb") as handle:
            return subprocess.Popen([sys.executable, "-c", script], stdout=handle)

    return launch, log


def test_jobs_start_after_what_they_need_and_share_the_cores(tmp_path: Path) -> None:
    launch, log = _recording_launcher(tmp_path)
    lines: list[str] = []
    finished = pr.run_jobs(_jobs(), 2, launch, cores=4, report=lines.append)
    assert len(finished) == 7 and all(f.returncode == 0 for f in finished)
    launched = [json.loads(line) for line in log.read_text().splitlines()]
    order = [record["stages"][0] for record in launched]
    for before, after in [("fingerprint", "featurize@a"), ("fit-sampler", "train@x"),
                          ("train@y", "report"), ("train@x", "report")]:  # fmt: skip
        assert order.index(before) < order.index(after)
    threads = {record["stages"][0]: int(record["threads"]) for record in launched}
    # alone at the head of the graph: every core; two experiments side by side: half each
    assert threads["fingerprint"] == 4 and threads["train@x"] == threads["train@y"] == 2
    assert any("ran ['train@x', 'evaluate@x']" in line for line in lines)


def test_a_failed_job_stops_what_depends_on_it_and_names_its_stages(tmp_path: Path) -> None:
    launch, log = _recording_launcher(tmp_path, fail="fit-sampler")
    with pytest.raises(pr.ReproError, match=r"fit-sampler failed \(exit 3\); 3 job\(s\) not run"):
        pr.run_jobs(_jobs(), 2, launch, cores=2, report=lambda line: None)
    launched = [json.loads(line)["stages"][0] for line in log.read_text().splitlines()]
    assert "fit-sampler" in launched and "train@x" not in launched and "report" not in launched


def test_after_the_head_has_run_dvc_status_says_which_jobs_can_be_skipped() -> None:
    stages, upstream = pr.parse_dot(DOT)
    jobs = pr.group_jobs(stages, upstream, lambda stage: 1.0)
    head = {0}  # fingerprint → download → subsample, which has just run
    nothing = {"fingerprint": ["always changed"]}
    assert pr.unchanged_jobs(jobs, upstream, nothing, head) == {1, 2, 3, 4, 5, 6}
    one = nothing | {"train@y": [{"changed deps": {"params.yaml": "modified"}}]}
    # train@y's job runs, and the report after it; the rest is up to date
    assert pr.unchanged_jobs(jobs, upstream, one, head) == {1, 2, 3, 4}
    feature = {"featurize@b": ["changed outs"]}
    assert pr.unchanged_jobs(jobs, upstream, feature, head) == {1}  # all else is below it
    assert pr.unchanged_jobs(jobs, upstream, {"other.dvc": ["changed outs"]}, head) == set()


def test_skipped_jobs_count_as_done_for_the_jobs_after_them(tmp_path: Path) -> None:
    launch, log = _recording_launcher(tmp_path)
    lines: list[str] = []
    pr.run_jobs(_jobs(), 2, launch, cores=2, report=lines.append, up_to_date=lambda ran: {1, 3, 4})
    launched = [json.loads(line)["stages"][0] for line in log.read_text().splitlines()]
    assert launched[0] == "fingerprint" and set(launched) == {
        "fingerprint",
        "featurize@b",
        "train@y",
        "report",
    }
    assert "repro: 3 of 7 jobs up to date" in lines


# --- through DVC ---------------------------------------------------------------------------

# Each of the two stages leaves a mark, then waits for the other's: with one stage at a time
# the first would wait out its 60 s and fail, so success means DVC ran them side by side.
RENDEZVOUS = (
    "import pathlib, sys, time; me, other, out = sys.argv[1:]; "
    "marks = pathlib.Path('marks'); marks.mkdir(exist_ok=True); (marks / me).touch(); "
    "deadline = time.time() + 60\n"
    "while not (marks / other).exists():\n"
    "    assert time.time() < deadline, 'ran alone'; time.sleep(0.05)\n"
    "pathlib.Path(out).write_text(me)"
)


def _dvc_project(root: Path) -> dict[str, str]:
    env = os.environ | {"DVC_NO_ANALYTICS": "1"}
    (root / "rendezvous.py").write_text(RENDEZVOUS)
    py = sys.executable
    (root / "dvc.yaml").write_text(
        f"""stages:
  left:
    cmd: {py} rendezvous.py left right left.txt
    deps: [rendezvous.py]
    outs: [left.txt]
  right:
    cmd: {py} rendezvous.py right left right.txt
    deps: [rendezvous.py]
    outs: [right.txt]
  both:
    cmd: {py} -c "import pathlib; p = pathlib.Path; p('both.txt').write_text(p('left.txt').read_text() + p('right.txt').read_text())"
    deps: [left.txt, right.txt]
    outs: [both.txt]
"""
    )
    (root / ".gitignore").write_text("marks/\n")
    for command in (["git", "init", "-q"], [py, "-m", "dvc", "init", "-q"]):
        subprocess.run(command, cwd=root, env=env, check=True)
    subprocess.run([py, "-m", "dvc", "config", "core.analytics", "false"], cwd=root, env=env, check=True)  # fmt: skip
    return env


def _tailkit_repro(
    root: Path, env: dict[str, str], *args: str, timeout: float = 300
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tailkit", "repro", *args],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_tailkit_repro_runs_independent_dvc_stages_side_by_side(tmp_path: Path) -> None:
    env = _dvc_project(tmp_path)
    result = _tailkit_repro(tmp_path, env, "--jobs", "2")
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "both.txt").read_text() == "leftright"
    assert "repro: done both" in result.stderr and "git add" not in result.stderr
    status = subprocess.run(
        [sys.executable, "-m", "dvc", "status", "--json"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(status.stdout) == {}  # dvc.lock records every stage as a plain repro would
    again = _tailkit_repro(tmp_path, env)
    assert again.returncode == 0 and "Running stage" not in again.stderr
    assert "repro: 1 of 3 jobs up to date" in again.stderr  # `both`: no DVC process for it
    # a stage taken out of the pipeline leaves dvc.lock too (dvc repro alone would keep it)
    lock = tmp_path / "dvc.lock"
    assert "both" in yaml.safe_load(lock.read_text())["stages"]
    pipeline = yaml.safe_load((tmp_path / "dvc.yaml").read_text())
    del pipeline["stages"]["both"]
    (tmp_path / "dvc.yaml").write_text(yaml.safe_dump(pipeline))
    kept = lock.read_text()
    pruned = _tailkit_repro(tmp_path, env)
    assert pruned.returncode == 0, pruned.stderr
    assert "dropped from dvc.lock, no longer in the pipeline: both" in pruned.stderr
    before, after = yaml.safe_load(kept)["stages"], yaml.safe_load(lock.read_text())["stages"]
    assert after == {name: before[name] for name in ("left", "right")}
    assert lock.read_text().startswith("schema: '2.0'\n")  # still DVC's own layout


def test_tailkit_repro_exits_non_zero_when_dvc_cannot_read_the_pipeline(tmp_path: Path) -> None:
    env = _dvc_project(tmp_path)
    (tmp_path / "dvc.yaml").write_text("stages: [not, a, mapping]\n")
    result = _tailkit_repro(tmp_path, env, timeout=120)
    assert result.returncode == 2 and result.stderr.startswith("Error: dvc dag failed")
    # DVC's whole message on one line: the file it names comes before the rule it quotes
    assert "dvc.yaml" in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_checkpoints_of_runs_no_longer_in_params_are_swept(tmp_path: Path) -> None:
    import copy

    from conftest import TINY_PARAMS

    from tailkit.pipeline.parallel_repro import sweep_checkpoints

    params = copy.deepcopy(TINY_PARAMS)
    params["base"]["extra_seeds"] = [1]
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    folder = tmp_path / "data" / "checkpoints"
    for run, size in {"softmax": 10, "softmax+seed1": 20, "gone": 300, "ldam+seed7": 4000}.items():
        (folder / run / "rows-000000000007").mkdir(parents=True)
        (folder / run / "state.pt").write_bytes(b"s" * size)
        (folder / run / "rows-000000000007" / "rows-000000000000.pt").write_bytes(b"r" * size)
    assert sweep_checkpoints(tmp_path) == (["gone", "ldam+seed7"], 2 * 300 + 2 * 4000)
    assert sorted(p.name for p in folder.iterdir()) == ["softmax", "softmax+seed1"]
    assert sweep_checkpoints(tmp_path) == ([], 0)
