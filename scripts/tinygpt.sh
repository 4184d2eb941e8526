#!/usr/bin/env bash
# Training research on CPU: a short tuner study on examples/tinygpt in a scratch copy.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
venv="${VENV:-$here/.venv}"
work="${RATCHET_DEMO_DIR:-$(mktemp -d /tmp/ratchet-tinygpt.XXXXXX)}"
mkdir -p "$work"
rm -rf "$work/tinygpt"
cp -r "$here/examples/tinygpt" "$work/tinygpt"
cd "$work/tinygpt"
rm -rf data model.pt
git init -q -b main
git add -A
git -c user.name=ratchet-demo -c user.email=demo@ratchet.invalid commit -qm "tinygpt task"
echo "== study in $PWD"
"$venv/bin/ratchet" run "$@"
column -t -s $'\t' results.tsv 2>/dev/null || cat results.tsv
