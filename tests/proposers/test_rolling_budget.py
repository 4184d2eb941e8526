"""Rolling's budget is a number of candidates that run (issue 23): a proposal that cannot
run is recorded on top, and a proposer that only repeats itself cannot hold a study open;
what rolling does with replies that have nothing runnable, and how long its slots waited."""

from __future__ import annotations

import json
import re
import threading

from conftest import ledger_of, whole_file
from llm_server import Answer
from test_latency import Improving as SlowImproving
from test_latency import run_study


class Repeating:
    """Every reply is the same change: after the first, each one repeats a tried change."""

    def __call__(self, request) -> Answer:
        return Answer(whole_file(8))


def test_a_proposer_that_repeats_itself_ends_a_rolling_study(tmp_path):
    """Rolling's budget counts candidates that run; a repeat is recorded `rejected`, with
    why, on top. One that only repeats cannot hold the study open: past as many repeats
    as the budget, no more is asked, and the study says so in one line."""
    repo, proc, _ = run_study(tmp_path, Repeating(), 'mode = "rolling"\ncandidates = 3\n',
                              timeout=240, evaluate_s=0)
    assert proc.returncode == 0, proc.stderr
    ledger = ledger_of(repo)
    cands = [c for c in ledger.candidates() if c.kind == "candidate"]
    ledger.close()
    ran = [c for c in cands if c.job_id is not None]
    unrun = [c for c in cands if c.job_id is None]
    assert len(ran) == 1, [(c.id, c.status, c.reasons) for c in cands]  # the one new change
    assert 1 <= len(unrun) <= 3 and all(c.status == "rejected" and c.reasons for c in unrun)
    assert "3 proposals could not run" in proc.stdout + proc.stderr


class RepeatingAfterOne:
    """The first reply's attempts are new changes (one each); every later one repeats the
    first change, so a reply after the first has nothing runnable."""

    def __init__(self) -> None:
        self.lock, self.replies = threading.Lock(), 0

    def __call__(self, request) -> Answer:
        with self.lock:
            self.replies += 1
            value = 8 - self.replies if self.replies <= 2 else 7
        return Answer(whole_file(value))


def test_a_barren_reply_is_not_asked_again_until_a_verdict(tmp_path):
    """A reply with nothing runnable (every proposal a repeat) is the proposer's answer to
    what it was shown: rolling does not ask the same question again while a verdict that
    changes it is coming (before, it asked again at once, a request a tick, until its
    limit of unrunnable proposals ended the study)."""
    model = RepeatingAfterOne()
    repo, proc, requests = run_study(tmp_path, model, 'mode = "rolling"\ncandidates = 12\n',
                                     timeout=240, evaluate_s=3.0)
    assert proc.returncode == 0, proc.stderr
    ledger = ledger_of(repo)
    cands = [c for c in ledger.candidates() if c.kind == "candidate"]
    ledger.close()
    ran = sorted((c for c in cands if c.job_id is not None), key=lambda c: c.seq)
    assert len(ran) == 2, [(c.id, c.status, c.reasons) for c in cands]
    # until the first candidate's verdict (its run and its confirmation, about 12 s) the
    # questions asked were few: the first, one after the barren reply, one after the
    # baseline's verdict, one on the would-be keep and its beside slots, each K = 2
    # requests and a retry or two (9 seen); asking again a tick after a barren reply
    # made 26 in the same span
    first_verdict = min(c.judged_at for c in ran)
    asked_meanwhile = [r for r in requests if r.at < first_verdict]
    assert len(asked_meanwhile) <= 14, len(asked_meanwhile)


def test_twins_in_one_reply_are_billed_not_recorded(tmp_path):
    """K requests made side by side may answer with the same change: the copy is not a
    candidate row (its twin is), and its call is billed, marked as dropped with why."""
    repo, proc, requests = run_study(tmp_path, Repeating(), 'mode = "rolling"\ncandidates = 3\n',
                                     timeout=240, evaluate_s=0)
    assert proc.returncode == 0, proc.stderr
    ledger = ledger_of(repo)
    cands = [c for c in ledger.candidates() if c.kind == "candidate"]
    calls = ledger.calls()
    ledger.close()
    assert not any("identical diff" in (c.reasons or "") for c in cands)
    assert len(calls) == len(requests)  # every request billed, twins' too
    twins = [c for c in calls if (c["fate"] or "").startswith("dropped: the same change")]
    assert twins and all(c["candidate"] is None for c in twins)


def rolling_waits(tmp_path, model, candidates: int, evaluate_s: float):
    """A rolling study of `candidates` against `model`: (its `proposer-wait` event, the
    candidates that ran, what it printed)."""
    repo, proc, _ = run_study(tmp_path, model, f'mode = "rolling"\ncandidates = {candidates}\n',
                              timeout=240, evaluate_s=evaluate_s)
    assert proc.returncode == 0, proc.stderr
    ledger = ledger_of(repo)
    [wait] = [json.loads(e["data"]) for e in ledger.events() if e["kind"] == "proposer-wait"]
    ran = [c for c in ledger.candidates() if c.kind == "candidate" and c.job_id is not None]
    ledger.close()
    return wait, ran, proc.stdout + proc.stderr


def test_rolling_says_how_long_slots_waited_for_replies(tmp_path):
    """Rolling counts the slot-seconds a free slot waited for a reply: at least the first
    reply's second for the slot the baseline leaves free, and that part on its own (only
    the baseline can overlap the first reply); said in one line at the end and kept in
    the ledger's events."""
    wait, _, out = rolling_waits(tmp_path, SlowImproving(delay=1.5), 2, evaluate_s=0.5)
    assert wait["slot_s"] >= 1.2 and 0 < wait["share"] < 1, wait
    # the first reply's 1.5 s, less the driver's own start-up, is the first part
    assert 1.2 <= wait["first_slot_s"] <= wait["slot_s"], wait
    assert 0 < wait["first_share"] <= wait["share"], wait
    # every reply had a new change: no request waited on a verdict to have one
    assert wait["gated_slot_s"] == 0, wait
    assert "slots waited" in out and "for the proposer's replies" in out
    assert "of it for the first reply" in out


class NewAfterEachVerdict:
    """One new change per candidate's verdict it is shown (a worse VALUE each time, so
    nothing is kept): asked twice with the same verdicts, it says the same thing, so a
    slot freed by a verdict waits for the reply asked after it, and no request made
    sooner could have filled it."""

    def __init__(self, delay: float) -> None:
        self.delay = delay

    def __call__(self, request) -> Answer:
        verdicts = len(re.findall(r"(?m)^- c\d+ \(round \d+\) \[(?:discard|crash)\]",
                                  request.prompt))
        value = 20 + verdicts
        return Answer(whole_file(value), delay=self.delay)


def test_rolling_tells_the_waits_a_verdict_gated_apart(tmp_path):
    """A proposer with nothing new until it sees the next verdict: the slot-seconds
    spent on requests asked only because a verdict came in (its last reply had nothing
    runnable) are counted apart from the first reply's, in the event and the line; they
    are latency no earlier request could have hidden."""
    wait, ran, out = rolling_waits(tmp_path, NewAfterEachVerdict(delay=1.0), 4,
                                   evaluate_s=0.5)
    assert len(ran) >= 2, wait
    # each later candidate's reply was asked at a verdict: about a second each, a slot free
    assert wait["gated_slot_s"] >= 0.8, wait
    assert wait["gated_slot_s"] + wait["first_slot_s"] <= wait["slot_s"] + 1e-3, wait
    assert 0 < wait["gated_share"] <= wait["share"], wait
    assert "asked after one with nothing new" in out

