"""Trusted evaluator (protected): scores solution.py without ever importing it.

solution.py runs in a child process (`ratchet.isolate.CandidateProcess`): it cannot patch
this evaluator, print metric lines into its output, or reach the metric channel, and a
call that hangs is killed after the timeout. The score goes to ratchet through the
trusted channel (`ratchet.channel.report`), which also prints `score: <number>`.
An evaluator that imports candidate code into its own process is not protected.
"""

import math
from pathlib import Path

from ratchet.channel import report
from ratchet.isolate import CandidateError, CandidateProcess

try:
    with CandidateProcess(Path(__file__).with_name("solution.py"), timeout=60) as solution:
        score = solution.call("score")  # runs solution.score() in the child, returns its value
except CandidateError as exc:
    report({"correct": False, "reason": str(exc).splitlines()[0][:300]})
else:
    ok = isinstance(score, int | float) and not isinstance(score, bool) and math.isfinite(score)
    report({"correct": True, "score": float(score)} if ok else {"correct": False, "reason": f"score() returned {score!r}"})
