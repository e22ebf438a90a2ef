"""``prefixpin audit --html`` rendered by a real headless Chromium (Debian's
``chromium``): its DOM has the lineage tree (forks under their parents), a row and
a bar per request, the observed tokens where the trace has usage, and each break
with its cause and marked diff; the screenshot is not blank and shows the bars'
colours.  A trace line that carries markup cannot script the page.

The screenshot is left in the session's log directory (``report.png``).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from benchmarks import bench_attribution, traces
from proxy.cli.report_html import COLORS
from tests.infra import png
from tests.infra.procs import prefixpin_argv

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)"),
]
HOSTILE = '<script>document.title="owned"</script><img src="http://127.0.0.1:9/x.png">'


def _chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    assert CHROMIUM is not None
    argv = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={tmp_path / 'chromium'}",
        "--window-size=1400,1000",
        *args,
    ]
    return subprocess.run(argv, capture_output=True, text=True, timeout=180)


def _trace(tmp_path: Path) -> Path:
    """A pre-fix hermes session (a review fork, breaks prefixpin fixes) and a few
    conversations with injected changes (breaks it cannot fix), some with usage."""
    pre, _ = traces.generate(traces.SMOKE)
    lines: list[dict[str, Any]] = [*pre, *bench_attribution.generate(bench_attribution.Spec(3, 4, 0.5, seed=3))]
    lines[1]["body"]["messages"].append({"role": "user", "content": HOSTILE})
    for i, line in enumerate(lines[:6]):
        line["usage"] = {"prompt_tokens": 4000 + 500 * i, "prompt_tokens_details": {"cached_tokens": 3000 * (i > 0)}}
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def test_the_report_renders_in_chromium(tmp_path: Path, log_dir: Path) -> None:
    trace, page = _trace(tmp_path), tmp_path / "report.html"
    out = subprocess.run(
        [*prefixpin_argv(), "audit", str(trace), "--html", str(page), "--json", "--no-progress"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    left = [r for r in report["requests"] if r["cause"]]
    assert left, "the injected changes leave breaks after canonicalization"

    dom = _chromium(tmp_path, "--dump-dom", page.as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    html = dom.stdout
    assert "<title>prefixpin audit:" in html and "owned" not in html.split("</title>")[0]
    assert len(re.findall(r'<tr class="request"', html)) == len(report["requests"])
    assert re.search(r'<li class="lineage root"[^>]*>.*?<ul><li class="lineage fork"', html, re.S)
    forks = [lin for lin in report["lineages"] if lin["kind"] == "fork"]
    assert forks and all(f'id="lineage-{lin["id"]}"' in html for lin in forks)
    breaks = html.split('<section id="breaks">')[1].split("</section>")[0]
    assert breaks.count('<article class="break"') == len(left)
    assert "<ins>" in breaks and "<del>" in breaks
    for cause in {r["cause"] for r in left}:
        assert f">{cause}</span>" in breaks
    assert html.count('class="bar observed"') == 6
    assert "<script" not in html and "http://127.0.0.1:9" not in html

    shot = log_dir / "report.png"
    taken = _chromium(tmp_path, f"--screenshot={shot}", page.as_uri())
    assert taken.returncode == 0 and shot.exists(), taken.stderr[-2000:]
    pixels = png.read(shot)
    assert pixels.shape == (1000, 1400, 3)
    colours = {tuple(int(c) for c in px) for px in np.unique(pixels.reshape(-1, 3), axis=0)}
    assert len(colours) > 100, "a blank or single-colour page"

    def shown(hex_colour: str) -> bool:
        rgb = tuple(int(hex_colour[i : i + 2], 16) for i in (1, 3, 5))
        return rgb in colours

    assert shown("#1d2330"), "the header"
    assert shown(COLORS["cacheable"]) and shown(COLORS["new"]), "the request bars"
    white = (pixels == 255).all(axis=2).mean()
    assert 0.2 < white < 0.95, f"{white:.0%} of the page is white"
