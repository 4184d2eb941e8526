"""The judge is a pure function: results, incumbent and acceptance in, verdicts out."""

from __future__ import annotations

import math

import pytest
from helpers import config_text

from ratchet.core.vocab import Outcome, Status
from ratchet.driver import judge
from ratchet.driver.config import loads_config
from ratchet.job.jobspec import JobResult


def config(extra: str = "", task_extra: str = ""):
    text = config_text() + extra
    if task_extra:
        text = text.replace('timeout = "60s"\n', f'timeout = "60s"\n{task_extra}')
    return loads_config(text.encode(), "ratchet.toml")


def ok(metric: float, samples: list[float] | None = None, **extra) -> JobResult:
    return JobResult(job_id="j", outcome=Outcome.OK, metric=metric,
                     samples=samples if samples is not None else [metric], extra=extra)


def entry(cid: str, result: JobResult, kind: str = "candidate", seq: int = 1,
          based: bool = True) -> judge.Entry:
    return judge.Entry(id=cid, kind=kind, seq=seq, result=result, commit=f"sha-{cid}",
                       based_on_incumbent=based)


def no_holdout(_: judge.Entry) -> JobResult:
    raise AssertionError("the hold-out must not run here")


INC = judge.Incumbent(commit="sha-inc", id="c0000", metric=10.0, samples=[10.0])


def test_keep_discard_crash_rejected_in_one_group():
    cfg = config()
    entries = [
        entry("c1", ok(8.0), seq=1),                       # better: keep
        entry("c2", ok(12.0), seq=2),                      # worse: discard
        entry("c3", JobResult(job_id="j", outcome=Outcome.TIMEOUT, reason="timed out"), seq=3),
        entry("c4", JobResult(job_id="j", outcome=Outcome.VIOLATION, reason="touched x"),
              seq=4),
        # a wrong result is the evaluator's `correct: false`, read from the field the worker
        # sets, never from the reason's text (which quotes the candidate's own output)
        entry("c5", JobResult(job_id="j", outcome=Outcome.FAILED, failed_stage="evaluate",
                              correct=False, reason="evaluate: evaluator reported it"), seq=5),
        entry("c6", JobResult(job_id="j", outcome=Outcome.FAILED, failed_stage="run",
                              reason="run failed: exit 1 (printed 'correct: false')"), seq=6),
    ]
    decision = judge.judge_group(cfg, entries, INC, no_holdout)
    status = {k: v.status for k, v in decision.verdicts.items()}
    assert status == {"c1": Status.KEEP, "c2": Status.DISCARD, "c3": Status.CRASH,
                      "c4": Status.REJECTED, "c5": Status.REJECTED, "c6": Status.CRASH}
    assert decision.winner == "c1"
    assert decision.incumbent.metric == 8.0 and decision.incumbent.commit == "sha-c1"
    assert "no improvement" in decision.verdicts["c2"].reasons[0]


def test_only_the_best_of_several_improvements_is_kept():
    decision = judge.judge_group(config(), [entry("a", ok(9.0), seq=1),
                                            entry("b", ok(7.0), seq=2)], INC, no_holdout)
    assert decision.winner == "b"
    assert decision.verdicts["a"].status == "discard"
    assert "beaten by b" in decision.verdicts["a"].reasons[-1]


def test_min_improvement_margin():
    cfg = config('[acceptance]\nmin_improvement = "5%"\n')
    small = judge.judge_group(cfg, [entry("a", ok(9.8))], INC, no_holdout)
    assert small.verdicts["a"].status == "discard"
    assert "min_improvement" in small.verdicts["a"].reasons[0]
    big = judge.judge_group(cfg, [entry("a", ok(9.0))], INC, no_holdout)
    assert big.verdicts["a"].status == "keep"


def test_noise_from_repeats_blocks_a_gain_within_it():
    cfg = config()
    noisy = judge.Incumbent(metric=10.0, samples=[8.0, 12.0, 10.0])
    decision = judge.judge_group(cfg, [entry("a", ok(9.5, [7.5, 11.5, 9.5]))], noisy,
                                 no_holdout)
    verdict = decision.verdicts["a"]
    assert verdict.status == "discard" and verdict.noise and verdict.noise > 0.5
    assert "the noise" in verdict.reasons[0]


def test_evaluator_reported_sem_is_used():
    """Single measurements carry no spread; the evaluator's `<metric>_sem` still counts."""
    cfg = config()
    inc = judge.Incumbent(metric=10.0, samples=[10.0], sem=0.4)
    without = judge.judge_group(cfg, [entry("a", ok(9.5))], judge.Incumbent(
        metric=10.0, samples=[10.0]), no_holdout)
    assert without.verdicts["a"].status == "keep"  # nothing known about noise
    with_sem = judge.judge_group(cfg, [entry("a", ok(9.5, score_sem=0.4))], inc, no_holdout)
    verdict = with_sem.verdicts["a"]
    assert verdict.status == "discard"
    # 2 standard errors of the difference: 2 * sqrt(0.4^2 + 0.4^2)
    assert verdict.noise == pytest.approx(2 * (0.32 ** 0.5))
    clear = judge.judge_group(cfg, [entry("a", ok(8.0, score_sem=0.1))], inc, no_holdout)
    assert clear.verdicts["a"].status == "keep"
    assert clear.incumbent.sem == pytest.approx(0.1)  # the new incumbent carries its SEM


def test_sem_of_ignores_nonsense():
    assert judge.sem_of({"score_sem": "x"}, "score") is None
    assert judge.sem_of({"score_sem": True}, "score") is None
    assert judge.sem_of({"score_sem": float("nan")}, "score") is None
    assert judge.sem_of({"score_sem": -0.2}, "score") == 0.2


def test_constraints_reject():
    cfg = config(task_extra='constraints = ["memory_gb <= 1"]\n')
    decision = judge.judge_group(cfg, [entry("a", ok(5.0, memory_gb=3.0)),
                                       entry("b", ok(6.0))], INC, no_holdout)
    assert decision.verdicts["a"].status == "rejected"
    assert "violated" in decision.verdicts["a"].reasons[0]
    assert decision.verdicts["b"].status == "rejected"
    assert "printed no memory_gb" in decision.verdicts["b"].reasons[0]


def test_holdout_runs_only_for_the_would_be_keep():
    cfg = config(task_extra='holdout = "python evaluate.py --holdout"\n')
    asked = []

    def holdout(e: judge.Entry) -> JobResult:
        asked.append(e.id)
        return JobResult(job_id="h", outcome=Outcome.OK, holdout=4.0)

    inc = judge.Incumbent(metric=10.0, samples=[10.0], holdout=5.0)
    decision = judge.judge_group(cfg, [entry("a", ok(9.0), seq=1), entry("b", ok(8.0), seq=2),
                                       entry("c", ok(11.0), seq=3)], inc, holdout)
    assert asked == ["b"]
    assert decision.winner == "b" and decision.incumbent.holdout == 4.0


def test_holdout_failure_or_regression_is_rejected_and_the_next_best_tried():
    cfg = config(task_extra='holdout = "python evaluate.py --holdout"\n')
    answers = {"b": JobResult(job_id="h", outcome=Outcome.FAILED, reason="exit code 3"),
               "a": JobResult(job_id="h", outcome=Outcome.OK, holdout=9.0)}
    inc = judge.Incumbent(metric=10.0, samples=[10.0], holdout=5.0)
    decision = judge.judge_group(cfg, [entry("a", ok(9.0), seq=1), entry("b", ok(8.0), seq=2)],
                                 inc, lambda e: answers[e.id])
    assert decision.verdicts["b"].status == "rejected"
    assert "overfit: exit code 3" in decision.verdicts["b"].reasons
    assert decision.verdicts["a"].status == "rejected"  # hold-out 9.0 regresses from 5.0
    assert "overfit: hold-out" in decision.verdicts["a"].reasons[-1]
    assert decision.winner is None and decision.incumbent.metric == 10.0


def test_baseline_sets_the_comparison_and_a_stale_candidate_cannot_win():
    cfg = config()
    empty = judge.Incumbent(commit="sha-start")
    decision = judge.judge_group(cfg, [entry("base", ok(10.0), kind="baseline", seq=0),
                                       entry("a", ok(8.0), seq=1, based=False),
                                       entry("b", ok(9.0), seq=2)], empty, no_holdout)
    assert decision.verdicts["base"].status == "keep"
    assert decision.verdicts["a"].status == "discard"
    assert "not based on the current incumbent" in decision.verdicts["a"].reasons[-1]
    assert decision.winner == "b"


def test_failed_baseline_leaves_nothing_to_compare():
    decision = judge.judge_group(
        config(), [entry("base", JobResult(job_id="j", outcome=Outcome.FAILED, reason="boom"),
                         kind="baseline", seq=0), entry("a", ok(1.0))],
        judge.Incumbent(), no_holdout)
    assert decision.verdicts["base"].status == "crash"
    assert decision.verdicts["a"].status == "discard"
    assert decision.winner is None


def test_a_co_run_reference_pools_into_the_incumbent_and_never_replaces_it():
    """A re-measure of the incumbent joins its estimate: the comparison is with the mean of
    every evaluation of the incumbent, not with the latest (noisier) one."""
    inc = judge.Incumbent(commit="sha-inc", metric=10.0, samples=[10.0, 10.0, 10.0])
    ref = entry("ref", ok(14.0), kind="incumbent", seq=0)  # a cold re-measure
    cand = entry("a", ok(12.0), seq=1)  # better than the re-measure, worse than the estimate
    decision = judge.judge_group(config(), [ref, cand], inc, no_holdout)
    assert decision.verdicts["ref"].status == "reference"
    assert decision.verdicts["a"].status == "discard"
    assert decision.incumbent.samples == [10.0, 10.0, 10.0, 14.0]
    assert decision.incumbent.metric == pytest.approx(11.0)


# -- confirmation on fresh pairs (issue 19) --------------------------------------------------


class Pairs:
    """A measurement of fresh pairs from fixed numbers (candidate, incumbent), counting what
    was asked: the judge's own test then runs on them."""

    def __init__(self, by_id: dict[str, list[tuple[float, float]]]) -> None:
        self.by_id, self.asked = by_id, []

    def __call__(self, e: judge.Entry, need: int):
        self.asked.append((e.id, need))
        return self.by_id[e.id][:need]


def confirming(pairs: Pairs, groups=None) -> judge.Confirmation:
    return judge.Confirmation(measure=pairs, groups=groups or {})


NOISY = judge.Incumbent(commit="sha-inc", id="c0000", metric=10.0,
                        samples=[10.3, 9.8, 10.1, 9.9, 10.0])


def test_a_would_be_keep_is_confirmed_on_fresh_pairs_before_it_is_kept():
    pairs = Pairs({"a": [(9.0, 10.1), (8.9, 9.9), (9.1, 10.0)]})
    decision = judge.judge_group(config(), [entry("a", ok(9.0))], NOISY, no_holdout,
                                 confirmation=confirming(pairs))
    verdict = decision.verdicts["a"]
    assert verdict.status == "keep" and verdict.code == judge.Reason.KEPT
    assert verdict.confirmation.step == "keep" and verdict.confirmation.pairs == len(verdict.pairs)
    assert "confirmed on" in verdict.reasons[-1]
    # the new incumbent's estimate is its own run and its confirmation runs, pooled
    assert decision.incumbent.samples == [9.0] + [c for c, _ in verdict.pairs]
    assert decision.incumbent.metric == pytest.approx(sum(decision.incumbent.samples)
                                                      / len(decision.incumbent.samples))


def test_a_lucky_measurement_is_not_confirmed_and_losers_cost_no_pair():
    pairs = Pairs({"a": [(10.2, 10.0), (9.9, 10.1)]})  # fresh pairs: no gain at all
    entries = [entry("a", ok(9.0), seq=1), entry("b", ok(9.6), seq=2),
               entry("c", ok(11.0), seq=3)]
    decision = judge.judge_group(config(), entries, NOISY, no_holdout,
                                 confirmation=confirming(pairs))
    assert decision.winner is None
    a, b, c = (decision.verdicts[k] for k in "abc")
    assert a.status == "discard" and a.code == judge.Reason.NOT_CONFIRMED
    assert "not confirmed" in a.reasons[-1]
    assert b.status == "discard" and b.code == judge.Reason.BEATEN
    assert c.status == "discard" and c.code == judge.Reason.NO_GAIN
    assert {cid for cid, _ in pairs.asked} == {"a"}  # only the round's best was re-measured
    # the incumbent's side of the pairs pooled into its estimate
    assert a.pairs and decision.incumbent.samples == NOISY.samples + [i for _, i in a.pairs]


def test_a_stale_winner_is_confirmed_as_its_own_files_against_the_incumbent():
    """Made on an older incumbent (not based on this one): with a confirmation its files
    are tested against the incumbent's on fresh pairs, by the same test, and kept as them;
    its lucky twin is refused by the same pairs. With noise = "ignore" (no fresh pairs) a
    stale candidate is still discarded."""
    real = Pairs({"a": [(9.0, 10.1), (8.9, 9.9), (9.1, 10.0)]})
    decision = judge.judge_group(config(), [entry("a", ok(9.0), based=False)], NOISY,
                                 no_holdout, confirmation=confirming(real))
    kept = decision.verdicts["a"]
    assert decision.winner == "a" and kept.status == "keep" and kept.code == judge.Reason.KEPT
    assert judge.STALE_NOTE in kept.reasons and "confirmed on" in kept.reasons[-1]
    assert decision.incumbent.commit == "sha-a"  # its own commit, files as measured
    lucky = Pairs({"a": [(10.2, 10.0), (9.9, 10.1)]})
    decision = judge.judge_group(config(), [entry("a", ok(9.0), based=False)], NOISY,
                                 no_holdout, confirmation=confirming(lucky))
    refused = decision.verdicts["a"]
    assert decision.winner is None and refused.code == judge.Reason.NOT_CONFIRMED
    assert judge.STALE_NOTE in refused.reasons and lucky.asked
    ignore = judge.judge_group(config('[acceptance]\nnoise = "ignore"\n'),
                               [entry("a", ok(9.0), based=False)], NOISY, no_holdout)
    assert ignore.winner is None and ignore.verdicts["a"].code == judge.Reason.STALE


def test_confirmation_stops_at_the_budget():
    cfg = config('[acceptance]\nconfirm_pairs = 3\n')
    noisy = [(9.9, 10.0), (9.95, 10.0), (9.8, 10.1), (9.0, 10.0)]  # small, noisy gains
    pairs = Pairs({"a": noisy})
    decision = judge.judge_group(cfg, [entry("a", ok(9.0))], NOISY, no_holdout,
                                 confirmation=confirming(pairs))
    assert decision.verdicts["a"].status == "discard"
    assert max(n for _, n in pairs.asked) == 3
    assert "not confirmed in 3 pairs" in decision.verdicts["a"].reasons[-1]


def test_the_false_keep_rate_is_the_users():
    """The same evidence is kept at a loose rate and not at a strict one."""
    evidence = {"a": [(9.5, 10.0), (9.6, 10.0), (9.4, 10.0)]}
    inc = judge.Incumbent(commit="sha-inc", metric=10.0, samples=[10.0, 10.4, 9.6, 10.0])
    loose = judge.judge_group(config('[acceptance]\nfalse_keep_rate = "20%"\nconfirm_pairs = 3\n'),
                              [entry("a", ok(9.5))], inc, no_holdout,
                              confirmation=confirming(Pairs(evidence)))
    strict = judge.judge_group(config('[acceptance]\nconfidence = 0.999\nconfirm_pairs = 3\n'),
                               [entry("a", ok(9.5))], inc, no_holdout,
                               confirmation=confirming(Pairs(evidence)))
    assert loose.winner == "a" and strict.winner is None


def test_on_a_log_scale_z0_compares_with_the_incumbents_geometric_mean():
    """With relative noise the test works on log ratios, so z_0 compares the candidate's
    log with the mean of the incumbent's logs. The log of the arithmetic mean is higher by
    about sigma^2 / 2: it credited every candidate with a gain it did not measure (about
    sigma / 2 in z_0, 0.05 at 10% noise), which raised the false-keep rate."""
    inc = judge.Incumbent(commit="sha-inc", metric=2.5, samples=[1.0, 4.0])
    at_geometric = entry("a", ok(2.0))  # the incumbent's geometric mean: no gain in logs

    def log_gain(c: float, i: float) -> float:
        return math.log(i) - math.log(c)  # minimize

    assert judge.screen_z(at_geometric, inc, 0.1, log_gain, 0.0, relative=True) \
        == pytest.approx(0.0, abs=1e-12)
    # on the metric's own scale the arithmetic mean stays the level
    assert judge.screen_z(at_geometric, inc, 0.1, lambda c, i: i - c, 0.0) \
        == pytest.approx(0.5 / (0.1 * math.sqrt(1.5)))


def test_a_gain_only_over_the_arithmetic_mean_is_not_re_measured():
    """A skewed incumbent record (arithmetic mean 11, geometric 9.8) and a well-known
    relative noise of about 10%: a candidate at 9.9 passes the cheap screen (it beats the
    pooled mean by 1.1) but has no gain on the log scale of the test, so look 0 discards
    it after the one pair the noise needs (z_0 over the arithmetic mean sent it on to three
    pairs)."""
    inc = judge.Incumbent(commit="sha-inc", metric=11.0, samples=[6.0, 16.0, 6.0, 16.0])
    other = [0.9, 1.1] * 50  # another commit, measured often: the study's noise
    pairs = Pairs({"a": [(9.9, 9.8)] * 10})
    decision = judge.judge_group(config(), [entry("a", ok(9.9))], inc, no_holdout,
                                 confirmation=confirming(pairs, {"sha-other": other}))
    verdict = decision.verdicts["a"]
    assert verdict.status == "discard" and verdict.code == judge.Reason.NOT_CONFIRMED
    assert "first gain is inside the noise" in verdict.reasons[-1]
    assert max(n for _, n in pairs.asked) == 1


def test_noise_ignore_keeps_on_one_measurement():
    cfg = config('[acceptance]\nnoise = "ignore"\n')
    pairs = Pairs({})
    decision = judge.judge_group(cfg, [entry("a", ok(9.0))], INC, no_holdout,
                                 confirmation=confirming(pairs))
    assert decision.winner == "a" and pairs.asked == []


def test_a_run_stopped_early_is_only_ever_discarded():
    stopped = ok(1.0, stopped_early=1)  # looks far better, but it was stopped
    decision = judge.judge_group(config(), [entry("a", stopped)], NOISY, no_holdout,
                                 confirmation=confirming(Pairs({})))
    assert decision.verdicts["a"].status == "discard"
    assert decision.verdicts["a"].code == judge.Reason.STOPPED_EARLY
