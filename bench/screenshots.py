"""Regenerate ``docs/screenshots``: every view of the app (classify, explore, compare, batch, inspect) at
1280x900 and 390x844, with the example cat photo loaded and results shown.

    python -m bench.screenshots [--out docs/screenshots] [-- extra pytest arguments]

The screenshots are taken by the browser tests (``tests/test_app_browser.py``: Playwright driving Debian's
chromium against ``python app.py``), which save them under ``$VIT_SCREENSHOTS``; this runs those tests with
it set to ``--out`` and checks that every file was written. Needs ``/usr/bin/chromium`` and playwright.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VIEWS = ("classify", "explore", "compare", "batch", "inspect")
SIZES = ("1280x900", "390x844")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=ROOT / "docs" / "screenshots")
    p.add_argument("pytest_args", nargs="*", help="passed on to pytest (after --)")
    args = p.parse_args()
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    start = time.time()
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        str(ROOT / "tests" / "test_app_browser.py"),
        "-p",
        "no:cacheprovider",
        "-rs",
        *args.pytest_args,
    ]
    code = subprocess.call(cmd, cwd=ROOT, env={**os.environ, "VIT_SCREENSHOTS": str(out)})
    expected = [out / f"{view}_{size}.png" for view in VIEWS for size in SIZES]
    stale = [p.name for p in expected if not p.is_file() or p.stat().st_mtime < start]
    if stale:
        print(f"not (re)written: {', '.join(stale)}", file=sys.stderr)
    else:
        print(f"{len(expected)} screenshots written to {out}")
    sys.exit(code or bool(stale))


if __name__ == "__main__":
    main()
