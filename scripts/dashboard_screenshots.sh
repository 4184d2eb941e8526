#!/usr/bin/env bash
# Regenerate docs/dashboard/*.png: the dashboard's browser tests each screenshot the page
# they check (a real study, served, in headless Chromium) into
# $RATCHET_DASHBOARD_SCREENSHOTS. Needs chromium (apt-get install chromium).
#   scripts/dashboard_screenshots.sh            # every page
#   scripts/dashboard_screenshots.sh -k compare # some of them
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-.venv/bin/python}"
export RATCHET_DASHBOARD_SCREENSHOTS="$PWD/docs/dashboard"
PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" -m pytest -q -p no:xdist \
  tests/web/test_serve.py tests/web/test_research_views.py tests/web/test_dashboard.py "$@"

# 256 colours a picture (the pages are flat colours): a tenth of the bytes, the same look
"$PYTHON" - <<'PY'
from pathlib import Path

from PIL import Image

for path in sorted(Path("docs/dashboard").glob("*.png")):
    with Image.open(path) as image:
        rgb = image.convert("RGB")
    for colours in (256, 128, 64):  # the fewest that keeps a picture under 200 KB
        rgb.quantize(colours, method=Image.Quantize.MEDIANCUT).save(path, optimize=True)
        if path.stat().st_size < 200_000:
            break
    print(f"{path}: {path.stat().st_size // 1024} KiB")
PY
