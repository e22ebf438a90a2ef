"""``prefixpin audit --html`` rendered by a real headless Chromium (Debian's
``chromium``): its DOM has the lineage tree (forks under their parents), a row per
request numbered by its index (as ``--json`` and the gate number it) with its bytes
as sent and after canonicalization, the observed tokens where the trace has usage,
and each break with its cause and every differing place, marked; the screenshot is
not blank and shows the bars' colours.  A large trace opens compact: the requests
without a break are not drawn (a CSS-only toggle, no script), lineages without one
are folded.  A trace line that carries markup cannot script the page.

The screenshots are left in the session's log directory (``report*.png``).
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
from proxy.cli.report_html import COLORS, COMPACT_AT
from tests.infra import png
from tests.infra.procs import prefixpin_argv

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)"),
]
HOSTILE = '<script>document.title="owned"</script><img src="http://127.0.0.1:9/x.png">'


def _chromium(tmp_path: Path, *args: str, height: int = 1000) -> subprocess.CompletedProcess[str]:
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
        f"--window-size=1400,{height}",
        *args,
    ]
    return subprocess.run(argv, capture_output=True, text=True, timeout=180)


def _trace(tmp_path: Path) -> Path:
    """A pre-fix hermes session (a review fork, breaks prefixpin fixes: the minute, and
    in one turn the memory counter too) and a few conversations with injected changes
    (breaks it cannot fix), some with usage."""
    pre, _ = traces.generate(traces.SMOKE)
    lines: list[dict[str, Any]] = [*pre, *bench_attribution.generate(bench_attribution.Spec(3, 4, 0.5, seed=3))]
    lines[1]["body"]["messages"].append({"role": "user", "content": HOSTILE})
    system = lines[5]["body"]["messages"][0]
    system["content"] = re.sub(r"\[\d+% — ([\d,]+)/", "[77% — 1,694/", system["content"], count=1)
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
    rows = re.findall(r'<tr class="request" data-break="(\w+)" id="req-(\d+)"><td class="idx">#(\d+)</td>', html)
    assert all(i == n for _, i, n in rows)  # the anchor and the label: the index
    by_index = {r["index"]: _state(r) for r in report["requests"]}
    assert {int(i): b for b, i, _ in rows} == by_index  # every request, its break state
    for row in html.split('<tr class="request"')[1:]:  # before and after, usage or not
        row = row.split("</tr>")[0]
        assert 'class="bar bytes sent"' in row and 'class="bar bytes"' in row
    assert re.search(r'<li class="lineage root"[^>]*>.*?<ul><li class="lineage fork"', html, re.S)
    forks = [lin for lin in report["lineages"] if lin["kind"] == "fork"]
    assert forks and all(f'id="lineage-{lin["id"]}"' in html for lin in forks)
    breaks = html.split('<section id="breaks">')[1].split("</section>")[0]
    assert breaks.count('<article class="break"') == len(left)
    assert "<ins>" in breaks and "<del>" in breaks
    for cause in {r["cause"] for r in left}:
        assert f">{cause}</span>" in breaks
    for r in left:  # numbered as in --json (and the gate's messages)
        assert f'<article class="break" id="break-{r["index"]}"' in breaks and f">#{r['index']}</a>" in breaks
    # Every differing place of a request, not only the first: the memory counter, then the minute.
    two = report["requests"][5]
    assert two["cause_before"] == "system_changed" and two["cause"] is None and len(two["places_before"]) == 2
    fixed = html.split('<section id="fixed"')[1].split("</section>")[0]
    article = fixed.split('id="break-5"')[1].split("</article>")[0]
    assert "2 places differ" in article and article.count('<div class="diff before">') == 2
    assert "77%" in article and "1,694" in article
    assert html.count('class="bar observed"') == 6
    assert "<script" not in html and "<img" not in html  # the hostile message: shown as text, in a diff
    assert "&lt;script&gt;document.title" in html
    assert 'id="only-breaks">' in html  # a small trace opens whole

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


def _state(r: dict[str, Any]) -> str:
    return "left" if r["cause"] else "fixed" if r["cause_before"] else "none"


BACKGROUND = (246, 247, 249)  # the page's (#f6f7f9)


def _painted_height(shot: Path) -> int:
    """Down to the last row of pixels that is not the page's background."""
    pixels = png.read(shot)
    drawn = np.nonzero((pixels != BACKGROUND).any(axis=2).any(axis=1))[0]
    return int(drawn[-1]) + 1 if drawn.size else 0


def test_a_large_trace_opens_compact(tmp_path: Path, log_dir: Path) -> None:
    """Four sessions as prefixpin forwards them (no break) and a few conversations with
    injected changes: past COMPACT_AT requests the page draws only the requests with a
    break, folds the lineages without one; unchecking the toggle (here: the same page
    without ``checked``) draws every request again."""
    _, ideal = traces.generate(traces.TraceSpec(sessions=4, turns=10, fork_every=5, seed=5))
    lines = [*ideal, *bench_attribution.generate(bench_attribution.Spec(2, 4, 0.5, seed=9))]
    assert len(lines) > COMPACT_AT
    trace, page = tmp_path / "large.jsonl", tmp_path / "large.html"
    trace.write_text("".join(json.dumps(line) + "\n" for line in lines))
    out = subprocess.run(
        [*prefixpin_argv(), "audit", str(trace), "--html", str(page), "--json", "--no-progress"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    broken = [r for r in report["requests"] if r["cause"] or r["cause_before"]]
    assert 0 < len(broken) < len(lines) // 4
    html = page.read_text()
    assert '<input type="checkbox" id="only-breaks" checked>' in html
    quiet = [
        lin for lin in report["lineages"] if not sum(lin["breaks_before"].values()) + sum(lin["breaks_after"].values())
    ]
    for lin in quiet:  # folded
        assert re.search(rf'id="lineage-{lin["id"]}"><details><summary>', html)
    assert "<script" not in html and "default-src 'none'" in html

    whole = tmp_path / "whole.html"
    whole.write_text(
        html.replace('id="only-breaks" checked>', 'id="only-breaks">').replace("<details>", "<details open>")
    )
    heights = {}
    for name, path in (("compact", page), ("whole", whole)):
        shot = log_dir / f"report-{name}.png"
        taken = _chromium(tmp_path, f"--screenshot={shot}", path.as_uri(), height=8000)
        assert taken.returncode == 0 and shot.exists(), taken.stderr[-2000:]
        heights[name] = _painted_height(shot)
    # Each request row is ~30 px: the whole page is taller by the rows the compact one hides.
    assert heights["whole"] - heights["compact"] > 20 * (len(lines) - len(broken)), heights
