#!/usr/bin/env bash
# Run a study on a bundled example in a scratch copy (the checkout stays clean), then
# show results.tsv, what was kept, and the refs every candidate keeps.
#   scripts/run_example.sh kernel-cpu [ratchet run options...]
set -euo pipefail
example="${1:?usage: scripts/run_example.sh EXAMPLE [ratchet run options]}"
shift
here="$(cd "$(dirname "$0")/.." && pwd)"
venv="${VENV:-$here/.venv}"
work="${RATCHET_DEMO_DIR:-$(mktemp -d "/tmp/ratchet-$example.XXXXXX")}"
mkdir -p "$work"
rm -rf "${work:?}/$example"
cp -r "$here/examples/$example" "$work/$example"
cd "$work/$example"
rm -rf data model.pt model.pt2 .ratchet results.tsv
git init -q
git add -A
git -c user.name=ratchet-demo -c user.email=demo@ratchet.invalid commit -qm "$example task"
echo "== study in $PWD"
"$venv/bin/ratchet" run "$@"
echo
echo "== results.tsv"
column -t -s $'\t' results.tsv 2>/dev/null || cat results.tsv
branch="$(git for-each-ref --format='%(refname:short)' 'refs/heads/ratchet/' | head -n 1)"
echo
echo "== what was kept (git diff HEAD $branch)"
git --no-pager diff HEAD "$branch"
echo
echo "== every candidate keeps a ref"
git for-each-ref --format='%(refname)' refs/ratchet | head -20
echo
echo "== to look around (ratchet is in the venv, not on PATH):"
echo "   source $venv/bin/activate && cd $PWD && ratchet status"
