#!/bin/sh
# A private local Ray test cluster: 2 CPUs and 2 *logical* GPUs on any machine, so GPU
# scheduling (at most 2 GPU jobs at once, CUDA_VISIBLE_DEVICES per job) is tested
# honestly without a GPU. Safe on a shared host: its own temp dir, free loopback ports,
# and `stop` stops only the processes this cluster started (never `ray stop`, which
# stops every Ray cluster on the machine).
# Usage: scripts/ray_cluster.sh start|stop|status
#   RATCHET_RAY_STATE  where the cluster's description is kept
#                      (default /tmp/ratchet-ray-cluster-$(id -u).json; `start` prints
#                      the job server and GCS addresses, also in that file)
#   RAY_NUM_CPUS / RAY_NUM_GPUS  resources to declare (2 / 2)
#   RAY_DEFAULT_PORTS=1  use Ray's default ports (6379, 8265, ...) instead of free ones
# Uses the Python next to ratchet's venv (PYTHON=... to override).
set -eu
here=$(cd "$(dirname "$0")/.." && pwd)
PYTHON=${PYTHON:-$here/.venv/bin/python}
[ -x "$PYTHON" ] || PYTHON=python3
state=${RATCHET_RAY_STATE:-/tmp/ratchet-ray-cluster-$(id -u).json}
case "${1:-}" in
start|stop|status)
    exec "$PYTHON" "$here/tests/backends/ray_cluster.py" "$1" "$state" ;;
*)
    echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
