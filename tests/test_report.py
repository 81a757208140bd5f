"""`kfray status` and `kfray report` on a real (tiny) search: tables, HTML, PNGs, lineage diffs."""
from __future__ import annotations

import re
import sqlite3

import pytest

from kfray.cli import main
from kfray.report.data import load_run
from kfray.report.html import lineage_html, write_report
from kfray.report.roofline import ceilings, shape_rows


@pytest.fixture(scope="module")
def run_dir(session_run):
    """One small real matmul search (2 islands, migrations, evolving prompts): the session's
    `session_run` (conftest.py), which test_search checks and these tests render."""
    return session_run["run_dir"]


@pytest.fixture(scope="module")
def report(run_dir):
    """`kfray report RUN` once (a render is ~4 CPU-s of matplotlib): (its terminal output, the HTML's
    path), read by the tests of what it wrote next to the run."""
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = main(["report", str(run_dir)])
    assert rc == 0, out.getvalue()[-2000:]
    return out.getvalue(), run_dir / "report.html"


def _images(html: str) -> list[str]:
    return re.findall(r'<img src="([^"]+)"', html)


def _check_pngs(html_path, names):
    from PIL import Image

    for name in names:
        p = html_path.parent / name
        assert p.is_file(), f"{name} is referenced but missing"
        assert p.stat().st_size > 8_000, f"{name} is suspiciously small"
        with Image.open(p) as im:
            im.verify()
        with Image.open(p) as im:
            assert im.format == "PNG" and min(im.size) > 250


def test_report_writes_html_and_every_png_it_references(run_dir, report):
    out, html_path = report
    assert "report.html" in out
    html = html_path.read_text()
    imgs = _images(html)
    expected = {"report/best_fitness.png", "report/tiers.png", "report/prompts.png", "report/archive_matmul.png",
                "report/lineage_matmul.png", "report/timings_matmul.png"}
    assert expected <= set(imgs)
    assert {f"report/{p.name}" for p in (run_dir / "report").glob("*.png")} == set(imgs)
    _check_pngs(html_path, imgs)
    # sources are escaped: no raw include brackets or quotes from the kernels leak into the markup
    assert "#include <" not in html and "#include &lt;" in html
    assert 'extern &quot;C&quot;' in html


def test_lineage_shows_a_diff_and_the_prompt_at_each_step(run_dir, report):
    html = report[1].read_text()
    section = html[html.index('id="lineage-matmul"'):]
    assert "root of the lineage" in section
    run = load_run(run_dir)
    child = next(c for c in run.cands if c["parent_id"] and run.source(c["id"]) != run.source(c["parent_id"]))
    chain = run.lineage(child["id"])
    assert chain[0]["parent_id"] is None and chain[-1]["id"] == child["id"] and len(chain) >= 2
    text = lineage_html(run, chain)
    assert re.search(r'<span class="(add|del)">[+-]', text), "a lineage step without a diff line"
    assert child["prompt_id"] in text and child["origin"] in text
    # the best's own lineage is shown with a diff exactly where one of its steps changed the source
    best_chain = run.lineage(run.best("matmul")["id"])
    changed = any(run.source(c["id"]) != run.source(c["parent_id"]) for c in best_chain[1:])
    own = section[:section.find("<h2", 1)] if "<h2" in section[1:] else section
    assert f"({len(best_chain)} steps" in own
    assert bool(re.search(r'<span class="(add|del)">[+-]', own)) == changed, (len(best_chain), changed)


def test_report_out_elsewhere_keeps_relative_png_paths(run_dir, tmp_path):
    out = tmp_path / "elsewhere" / "r.html"
    html_path, pngs = write_report(run_dir, out)
    assert html_path == out and all(p.parent == out.parent / "report" for p in pngs)
    _check_pngs(out, _images(out.read_text()))


def test_report_rebuilds_archives_when_no_island_state_was_saved(run_dir, tmp_path):
    """A run still in progress (or killed) has no islands rows: archives come from the candidates."""
    copy = tmp_path / "partial"
    copy.mkdir()
    src, dst = sqlite3.connect(run_dir / "kfray.db"), sqlite3.connect(copy / "kfray.db")
    src.backup(dst)
    dst.execute("DELETE FROM islands")
    dst.execute("UPDATE meta SET value = '\"running\"' WHERE key = 'status'")
    dst.commit()
    src.close()
    dst.close()
    html_path, pngs = write_report(copy)
    _check_pngs(html_path, _images(html_path.read_text()))
    assert any(p.name == "archive_matmul.png" for p in pngs)


def test_status_prints_islands_tiers_and_activity(run_dir, capsys):
    assert main(["status", str(run_dir)]) == 0
    out = capsys.readouterr().out
    assert re.search(r"matmul\s*│\s*0\s*│", out) and re.search(r"matmul\s*│\s*1\s*│", out)
    assert "best fitness" in out and "best speedup" in out and "cells" in out and "generations" in out
    assert re.search(r"tiers: .*correct \d+", out)
    assert "evaluations/min" in out and "migrations:" in out and "prompt generations" in out


def test_status_watch_returns_once_the_run_has_finished(run_dir, capsys):
    assert main(["status", str(run_dir), "--watch", "0.1"]) == 0
    assert main(["status", "--watch", str(run_dir)]) == 0     # the folder right after --watch works too
    assert "islands" in capsys.readouterr().out


def test_status_and_report_without_a_database_exit_2(tmp_path, capsys):
    for cmd in ("status", "report"):
        assert main([cmd, str(tmp_path)]) == 2
        err = capsys.readouterr().err
        assert "no kfray.db" in err and str(tmp_path) in err and "Traceback" not in err


def test_roofline_uses_device_ceilings_and_falls_back_to_achieved_rates():
    assert ceilings({"copy_gbps": 4190.0, "fp32_gflops": 50600.0}) == {
        "gbps": ("copy_gbps", 4190.0), "gflops": ("fp32_gflops", 50600.0)}
    assert ceilings({"nested": {"copy_bandwidth_gbps": 4.19, "fp32_matmul_tflops": 50.6}})["gflops"][1] == 50600.0
    assert ceilings({"cores": 2, "name": "cpu"}) == {"gbps": None, "gflops": None}
    cand = {"task": "axpb", "times": {"n1M": 1e-3}, "ref_times": {"n1M": 2e-3}, "facts": {}}
    (row,) = shape_rows(cand, {"copy_gbps": 100.0})
    assert row["bytes"] == 8 * (1 << 20) and row["speedup"] == pytest.approx(2.0)
    assert row["roof"] == pytest.approx(8 * (1 << 20) / 100e9) and row["bound"] == "memory"
    assert row["gbps"] == pytest.approx(8 * (1 << 20) / 1e-3 / 1e9)
    (row,) = shape_rows(cand, {})
    assert row["roof"] is None and row["gflops"] == pytest.approx(2 * (1 << 20) / 1e-3 / 1e9)
