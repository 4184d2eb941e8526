#!/bin/sh
# Start / stop a local Ray test cluster: 2 CPUs and 2 *logical* GPUs on any machine, so
# GPU scheduling (at most 2 GPU jobs at once, CUDA_VISIBLE_DEVICES per job) is tested
# honestly without a GPU. Usage: scripts/ray_cluster.sh start|stop|status
# Uses the `ray` next to the Python that runs ratchet (RAY=... to override).
set -eu
here=$(cd "$(dirname "$0")/.." && pwd)
RAY=${RAY:-$here/.venv/bin/ray}
[ -x "$RAY" ] || RAY=ray
export RAY_USAGE_STATS_ENABLED=0
case "${1:-}" in
start)
    "$RAY" start --head --num-cpus="${RAY_NUM_CPUS:-2}" --num-gpus="${RAY_NUM_GPUS:-2}" \
        --include-dashboard=true --dashboard-host=127.0.0.1 \
        --object-store-memory=500000000 --disable-usage-stats
    # the job server answers a while after `ray start` returns
    py=$(dirname "$RAY")/python
    [ -x "$py" ] || py=python3
    "$py" - <<'PY'
import sys, time
from ray.job_submission import JobSubmissionClient
deadline = time.time() + 90
while True:
    try:
        JobSubmissionClient("http://127.0.0.1:8265").list_jobs()
        print("ray job server is up at http://127.0.0.1:8265")
        break
    except Exception as exc:
        if time.time() > deadline:
            sys.exit(f"ray job server did not answer within 90 s: {exc}")
        time.sleep(1)
PY
    ;;
stop)
    "$RAY" stop --force ;;
status)
    "$RAY" status ;;
*)
    echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
