#!/usr/bin/env bash
# The main job: a real study on the bundled CPU kernel example, in a scratch copy, so the
# checkout stays clean. Prints results.tsv and the kept diff at the end.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
venv="${VENV:-$here/.venv}"
work="${RATCHET_DEMO_DIR:-$(mktemp -d /tmp/ratchet-demo.XXXXXX)}"
mkdir -p "$work"
rm -rf "$work/kernel-cpu"
cp -r "$here/examples/kernel-cpu" "$work/kernel-cpu"
cd "$work/kernel-cpu"
git init -q -b main
git add -A
git -c user.name=ratchet-demo -c user.email=demo@ratchet.invalid commit -qm "kernel-cpu task"
echo "== study in $PWD"
"$venv/bin/ratchet" run "$@"
echo
echo "== results.tsv"
column -t -s $'\t' results.tsv 2>/dev/null || cat results.tsv
echo
echo "== what was kept (git diff main ratchet/softmax-cpu)"
git --no-pager diff main ratchet/softmax-cpu
echo
echo "== every candidate keeps a ref"
git for-each-ref --format='%(refname)' refs/ratchet | head -20
