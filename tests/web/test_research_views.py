"""The tuner, training and kernel views, on a real study that has each kind of data:
two tuned knobs, a `run` phase that prints a loss curve, and an evaluator that prints
the kernel harness's own per-shape table (`SweepReport.table()`) and sweep metrics.
Loaded in a real headless Chromium from the static report, served live too (one code).
"""

from __future__ import annotations

import re
import textwrap

import optuna
import pytest
from helpers import config_text, make_repo, ratchet

from ratchet.store.ledger import Ledger
from web.browser import Browser, needs_chromium
from web.test_serve import serving, shots_dir

SOLUTION = '''
"""Editable."""

X = 3.0  # the knob that matters
Y = 1  # the knob that barely does


def score():
    return (X - 1.25) ** 2 + 0.01 * Y
'''

TRAIN = '''
import solution

for step in range(0, 50, 10):
    loss = 4.0 / (1 + step / 10) + abs(solution.X - 1.25)
    print(f"step {step:5d} | loss {loss:.4f} | tok/s {1000 + 10 * step}", flush=True)
'''

EVALUATOR = '''
import sys

from ratchet.kernels.sweep import ShapeResult, SweepReport

import solution

rows = []
for n in (256, 1024, 4096):
    base = 1e-3 * n / 1024
    took = base * (1 + solution.score()) / 2
    rows.append(ShapeResult(shape={"n": n}, dtype="float32", holdout=False, correct=True,
                            reasons=[], time_s=took, baseline_time_s=base,
                            speedup=base / took, time_sem_rel=0.01))
report = SweepReport(rows)
print(report.table(), file=sys.stderr)
metrics = report.metrics()
print("correct: true")
print(f"score: {solution.score():.6f}")
for key in ("speedup", "min_speedup", "max_speedup", "shapes"):
    print(f"{key}: {metrics[key]}")
'''

TASK = textwrap.dedent('''
    [task]
    name = "views"
    editable = ["solution.py"]
    protected = ["evaluate.py", "train.py"]
    run = "python train.py"
    evaluate = "python evaluate.py"
    timeout = "60s"
''')


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    repo = make_repo(tmp_path_factory.mktemp("views") / "repo", {
        "ratchet.toml": config_text(
            task=TASK, search='[search]\nproposer = "tune"\nparallel = 3\nrounds = 2\n',
            knobs='[tune.knobs]\n"solution.py:X" = { choices = [3.0, 2.0, 1.5, 1.0] }\n'
                  '"solution.py:Y" = { choices = [1, 2, 3] }\n',
            backend='[backend]\nkind = "local"\nslots = 3\n'),
        "evaluate.py": EVALUATOR, "train.py": TRAIN, "solution.py": SOLUTION})
    ratchet(repo, "run", check=True)
    ratchet(repo, "report", check=True)
    return repo


def expected_importance(repo) -> dict[str, float]:
    """Optuna's own evaluator over the trials as the ledger has them."""
    ledger = Ledger.readonly(repo / ".ratchet" / "ledger.db")
    trials = [c for c in ledger.candidates() if c.kind == "candidate"
              and c.status in ("keep", "discard") and c.metric is not None]
    ledger.close()
    dists = {"solution.py:X": optuna.distributions.CategoricalDistribution([3.0, 2.0, 1.5, 1.0]),
             "solution.py:Y": optuna.distributions.CategoricalDistribution([1, 2, 3])}
    study = optuna.create_study(direction="minimize")
    for c in trials:
        study.add_trial(optuna.trial.create_trial(
            params={k: c.params[k] for k in dists}, distributions=dists, value=c.metric))
    return optuna.importance.get_param_importances(study)


@needs_chromium
def test_tuner_training_and_kernel_views(study, tmp_path):
    ledger = Ledger.readonly(study / ".ratchet" / "ledger.db")
    cands = ledger.candidates()
    inc = ledger.candidate(ledger.get("incumbent_id"))
    ledger.close()
    trials = [c for c in cands if c.kind == "candidate" and c.metric is not None]
    assert len(trials) >= 3 and inc is not None

    with Browser(tmp_path / "profile") as browser:
        browser.goto((study / ".ratchet" / "report" / "index.html").as_uri())
        titles = browser.eval("Array.from(document.querySelectorAll('svg.chart > title'))"
                              ".map(t => t.textContent)")
        # tuner: one scatter per knob, each point a measured trial
        assert {"score against solution.py:X", "score against solution.py:Y"} <= set(titles)
        points = browser.eval("Array.from(document.querySelectorAll('svg.chart')).filter(s =>"
                              " s.querySelector('title').textContent === 'score against solution.py:X')"
                              "[0].querySelectorAll('g.mark').length")
        assert points == len([c for c in trials if c.status in ("keep", "discard")])
        shown = browser.eval("Object.fromEntries(Array.from(document.querySelectorAll("
                             "'#importance tbody tr')).map(r => [r.cells[0].textContent,"
                             " Number(r.cells[1].textContent)]))")
        want = expected_importance(study)
        assert set(shown) == set(want)
        for knob, value in want.items():
            assert shown[knob] == pytest.approx(value, abs=0.0015)  # printed to 3 places

        # training: loss and tokens/s against step, one line per run, the incumbent dashed
        assert {"loss against step", "tokens/s against step"} <= set(titles)
        series = browser.eval("Array.from(document.querySelectorAll('path.line[data-series=loss]'))"
                              ".map(p => [p.dataset.id, p.getAttribute('d').split('L').length,"
                              " p.getAttribute('stroke-dasharray')])")
        ran = {c.id for c in cands if any(p["name"] == "run" for p in c.phases or [])}
        assert {s[0] for s in series} <= ran and inc.id in {s[0] for s in series}
        assert all(n == 5 for _, n, _ in series)  # the 5 steps train.py printed
        assert [dash for cid, _, dash in series if cid == inc.id] == ["5 4"]

        # kernels: the incumbent's sweep figures and its per-shape table, as printed
        text = browser.eval("document.body.textContent")
        assert f"Kernel: the incumbent {inc.id}" in text
        rows = browser.eval(f"Array.from(document.querySelectorAll('#shapes-{inc.id} tbody tr'))"
                            ".map(r => Array.from(r.cells).map(c => c.textContent))")
        assert [r[0] for r in rows] == ["n=256", "n=1024", "n=4096"]
        speedup = 2 / (1 + inc.metric)  # what the evaluator's formula gives
        assert all(float(r[7]) == pytest.approx(speedup, abs=0.0006) for r in rows)
        assert float(inc.extra["speedup"]) == pytest.approx(speedup, rel=1e-6)
        browser.screenshot(shots_dir(tmp_path) / "research-views.png")

        # the candidate's page has its own per-shape table and its own curve
        browser.goto((study / ".ratchet" / "report" / "c" / f"{inc.id}.html").as_uri())
        assert browser.eval(f"document.querySelectorAll('#shapes-{inc.id} tbody tr').length") == 3
        assert browser.eval("document.querySelectorAll('path.line[data-series=loss]').length") >= 1

    # served live, the same views from the same code
    with serving(study) as url, Browser(tmp_path / "profile-live") as browser:
        browser.goto(url)
        live = browser.eval("Object.fromEntries(Array.from(document.querySelectorAll("
                            "'#importance tbody tr')).map(r => [r.cells[0].textContent,"
                            " Number(r.cells[1].textContent)]))")
        assert live == shown
        assert re.search(r"Kernel: the incumbent c\d{4}", browser.eval("document.body.textContent"))


SLOW_TRAIN = '''
import time
import solution

for step in range(0, 100, 10):
    loss = 4.0 / (1 + step / 10) + abs(solution.X - 1.25)
    print(f"step {step:5d} | loss {loss:.4f} | tok/s {1000 + 10 * step}", flush=True)
    time.sleep(0.5)
'''


@needs_chromium
@pytest.mark.slow  # 25-30 s side by side
def test_a_training_curve_grows_on_the_open_page_while_it_trains(tmp_path):
    """The worker streams the head of a phase's output to its log (procs.CappedLog), the
    server passes growing logs on (at most every LOG_REFRESH_S), and the open page redraws
    the running job's curve, labelled running, longer each time: never reloaded."""
    import os
    import subprocess

    from helpers import RATCHET, ROOT

    repo = make_repo(tmp_path / "repo", {
        "ratchet.toml": config_text(
            task=TASK, search='[search]\nproposer = "tune"\nparallel = 1\nrounds = 1\n',
            knobs='[tune.knobs]\n"solution.py:X" = { choices = [3.0, 2.0, 1.5, 1.0] }\n'),
        "evaluate.py": EVALUATOR, "train.py": SLOW_TRAIN, "solution.py": SOLUTION})
    ratchet(repo, "run", check=True)  # the baseline: the ledger exists
    curve = ("(() => { const p = Array.from(document.querySelectorAll("
             "'path.line[data-series=loss]')).find(p => p.closest('svg')"
             ".textContent.includes(p.dataset.id + ' (running)'));"
             " return p && [p.dataset.id, p.getAttribute('d').split('L').length]; })()")
    with serving(repo) as url, Browser(tmp_path / "profile") as browser:
        browser.goto(url)
        browser.eval("window.stillThisPage = 7")
        run = subprocess.Popen([*RATCHET, "run", "--rounds", "2", "--repo", str(repo)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                               env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
        try:
            cand_id, first = browser.wait_for(curve, timeout=90, interval=0.1)
            assert first < 10  # drawn while train.py was still printing
            later = browser.wait_for(
                f"(() => {{ const c = {curve}; return c && c[1] > {first} && c[1]; }})()",
                timeout=60, interval=0.1)
            assert first < later <= 10
            assert run.wait(timeout=120) == 0, run.stderr.read() if run.stderr else ""
        finally:
            if run.poll() is None:
                run.kill()
        assert browser.eval("window.stillThisPage") == 7
        final = browser.wait_for(
            f"(() => {{ const p = document.querySelector('path.line[data-series=loss]"
            f"[data-id={cand_id}]'); return p && p.getAttribute('d').split('L').length; }})()",
            timeout=30)
        assert final == 10  # every step train.py printed, from the finished run's log
    ledger = Ledger.readonly(repo / ".ratchet" / "ledger.db")
    assert ledger.candidate(cand_id).is_judged
    ledger.close()
