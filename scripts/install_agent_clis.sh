#!/usr/bin/env bash
# Installs the coding-agent CLIs that tests/agent_cli drives, from their registry packages,
# pinned, into .venv-agents/ (never the system's PATH or the project's .venv):
#   .venv-agents/node/   npm prefix: Claude Code and Codex (each ships its native binary
#                        in a per-platform package that npm picks)
#   .venv-agents/aider/  its own virtual environment: aider-chat pins ~100 packages
#                        (litellm, tree-sitter, numpy...) that must not move ratchet's
#   .venv-agents/bin/    one link per CLI; the tests look here first, then on PATH
# Best effort per CLI: one that cannot be installed is reported and its tests skip.
# Re-running is cheap: a CLI whose pinned version is already there is left alone.
set -uo pipefail
cd "$(dirname "$0")/.."

CLAUDE_CODE_VERSION=2.1.197
CODEX_VERSION=0.171.0
AIDER_VERSION=0.86.2
PYTHON=${PYTHON:-python3}
DEST=${RATCHET_AGENTS_DIR:-.venv-agents}

mkdir -p "$DEST/bin"
DEST=$(cd "$DEST" && pwd)
LOG="$DEST/install.log"  # the package managers' own output, for when an install fails
: >"$LOG"
failed=()

have_version() {  # have_version BIN VERSION: the installed CLI reports VERSION
  [ -x "$DEST/bin/$1" ] && timeout 60 "$DEST/bin/$1" --version 2>/dev/null | grep -qF "$2"
}

npm_cli() {  # npm_cli BIN PACKAGE VERSION
  local bin=$1 package=$2 version=$3
  if have_version "$bin" "$version"; then echo "$bin $version: already installed"; return; fi
  if ! command -v npm >/dev/null 2>&1; then failed+=("$bin (no npm)"); return; fi
  if timeout 600 npm install --prefix "$DEST/node" --no-audit --no-fund --loglevel=error \
      "$package@$version" >>"$LOG" 2>&1; then
    ln -sf "$DEST/node/node_modules/.bin/$bin" "$DEST/bin/$bin"
    echo "$bin $version: installed"
  else
    failed+=("$bin ($package@$version: npm install failed)")
  fi
}

npm_cli claude @anthropic-ai/claude-code "$CLAUDE_CODE_VERSION"
npm_cli codex @openai/codex "$CODEX_VERSION"

if have_version aider "$AIDER_VERSION"; then
  echo "aider $AIDER_VERSION: already installed"
elif "$PYTHON" -m venv "$DEST/aider" >>"$LOG" 2>&1 \
    && timeout 900 "$DEST/aider/bin/pip" install -q --disable-pip-version-check \
        "aider-chat==$AIDER_VERSION" >>"$LOG" 2>&1; then
  ln -sf "$DEST/aider/bin/aider" "$DEST/bin/aider"
  echo "aider $AIDER_VERSION: installed"
else
  failed+=("aider (aider-chat==$AIDER_VERSION: pip install failed)")
fi

if [ ${#failed[@]} -gt 0 ]; then
  echo "warning: not installed: ${failed[*]}; their tests in tests/agent_cli will skip" \
       "(package managers' output: $LOG)" >&2
  tail -n 20 "$LOG" >&2
fi
exit 0
