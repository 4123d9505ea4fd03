"""The documentation site: maths rendered offline by a MathJax shipped in the site, executed notebooks (with their
figures) as the method pages, the claims report with links that resolve, one index in the navigation, wide code
that scrolls, and a headless-Chromium check (tools/check_site.py) that finds rendered equations and figures."""
import base64
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
IGNORE = shutil.ignore_patterns(".venv", ".git", "runs", "_docs", "site", "__pycache__", "*.egg-info", ".cache",
                                ".pytest_cache", "node_modules")


def _hooks():
    spec = importlib.util.spec_from_file_location("genlab_mkdocs_hooks", ROOT / "tools" / "mkdocs_hooks.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    "The site built by tools/build_docs.sh in a copy of the project that keeps reports/ (the executed runs)."
    proj = tmp_path_factory.mktemp("docs") / "proj"
    shutil.copytree(ROOT, proj, ignore=IGNORE)
    res = subprocess.run(["bash", "tools/build_docs.sh"], cwd=proj, capture_output=True, text=True, timeout=600,
                         env=dict(os.environ, MKDOCS=str(BIN / "mkdocs")))
    assert res.returncode == 0, res.stderr[-3000:]
    return proj


def _method_slugs(proj):
    out = {}
    for nb in sorted((proj / "nbs").glob("*.ipynb")):
        m = re.match(r"^(\d\d)_(\w+)$", nb.stem)
        if m and int(m.group(1)) >= 10:
            out[m.group(2)] = nb.stem
    return out


def _page_links(html: str):
    return [unquote(t) for t in re.findall(r'(?:href|src)="([^"#?]+)', html)
            if not re.match(r"^[a-z][a-z0-9+.-]*:", t, re.I)]


def _resolves(page: Path, target: str, site: Path) -> bool:
    p = (page.parent / target).resolve()
    if site.resolve() not in (p, *p.parents):
        return False
    return p.is_file() or (p / "index.html").is_file()


def test_mathjax_is_shipped_and_referenced_no_cdn(built):
    site = built / "site"
    mj = site / "assets" / "mathjax" / "tex-svg-full.js"
    assert mj.is_file() and mj.stat().st_size > 500_000, "MathJax is not copied into the site"
    assert "MathJax" in mj.read_text(encoding="utf-8", errors="replace")
    cfg = (site / "assets" / "mathjax-config.js").read_text()
    assert "jp-RenderedMarkdown" in cfg and "arithmatex" in cfg and '"$$"' in cfg
    pages = sorted(site.rglob("*.html"))
    assert len(pages) > 10
    for page in pages:
        html = page.read_text(encoding="utf-8")
        remote = re.findall(r'<script\b[^>]*\bsrc="((?:https?:)?//[^"]+)"', html)
        remote += re.findall(r'import\(\s*"(https?://[^"]+)"', html)
        remote += re.findall(r'<link\b[^>]*rel="stylesheet"[^>]*href="((?:https?:)?//[^"]+)"', html)
        assert not remote, f"{page.relative_to(site)} loads from other hosts: {remote[:3]}"
        if page.name == "index.html":                     # every page mkdocs wrote (not the standalone report.html)
            scripts = re.findall(r'<script\b[^>]*\bsrc="([^"]+)"', html)
            for name in ("assets/mathjax-config.js", "assets/mathjax/tex-svg-full.js"):
                hits = [s for s in scripts if s.endswith(name)]
                assert hits and _resolves(page, hits[0], site), f"{page.relative_to(site)} does not load {name}"


def test_method_pages_are_the_executed_notebooks_with_figures(built):
    site, hooks = built / "site", _hooks()
    executed_any = False
    for slug, stem in _method_slugs(built).items():
        html = (site / stem / "index.html").read_text(encoding="utf-8")
        executed = hooks.executed_notebook(built / "reports", slug)
        if executed is None:
            assert "Source notebook" in html and "no executed full-preset report" in html, stem
            continue
        executed_any = True
        nb = json.loads(executed.read_text())
        pngs = [o["data"]["image/png"] for c in nb["cells"] if c["cell_type"] == "code"
                for o in c.get("outputs", []) if "image/png" in o.get("data", {})]
        imgs = re.findall(r'<img\b[^>]*\bsrc="data:image/png;base64,([^"]+)"', html)
        assert "Executed notebook" in html and executed.parent.name in html, stem
        assert len(imgs) >= 1 and len(imgs) >= len(pngs), f"{stem}: {len(imgs)} figures shown, {len(pngs)} in the run"
        assert base64.b64decode(imgs[0])[:8] == b"\x89PNG\r\n\x1a\n"
        # the executed notebook itself can be downloaded from beside the page
        assert (site / stem / executed.name).read_bytes() == executed.read_bytes()
    if (built / "reports").is_dir() and any((built / "reports").glob("*/*/*.ipynb")):
        assert executed_any, "reports/ holds executed runs but no method page shows one"


def test_report_is_in_the_site_and_its_links_resolve(built):
    site = built / "site"
    if not (built / "reports" / "report.md").is_file():
        pytest.skip("no reports/report.md in this checkout: nothing to link")
    checked = 0
    for page in (site / "report" / "index.html", site / "report" / "report.html"):
        assert page.is_file(), f"{page.relative_to(site)} missing"
        html = page.read_text(encoding="utf-8")
        if page.name == "index.html":
            html = html[html.index('<article'):html.index('</article>')]
        links = _page_links(html)
        bad = [t for t in links if not _resolves(page, t, site)]
        assert not bad, f"{page.relative_to(site)}: links that resolve to nothing: {bad[:5]}"
        imgs = re.findall(r'<img\b[^>]*\bsrc="([^"]+)"', html)
        assert imgs and all(_resolves(page, t, site) for t in imgs)
        # the executed-notebook links (whatever the report's wording) lead to the rendered method pages
        method_pages = {f"{stem}/index.html" for stem in _method_slugs(built).values()}
        to_pages = [t for t in links if str((page.parent / t / "index.html").resolve().relative_to(site.resolve()))
                    in method_pages] if links else []
        assert to_pages, f"{page.relative_to(site)} links no method page (its executed-notebook links)"
        assert not [t for t in links if t.endswith(".ipynb") and not _resolves(page, t, site)]
        checked += len(links)
    assert checked > 10
    home = (site / "index.html").read_text(encoding="utf-8")
    assert 'href="report/"' in home, "the claims report is not linked from the navigation"


def test_index_appears_once_in_the_navigation(built):
    site = built / "site"
    for page in (site / "index.html", site / "10_flow_matching" / "index.html"):
        html = page.read_text(encoding="utf-8")
        nav = html[html.index("md-nav--primary"):]
        nav = nav[:nav.index("md-sidebar--secondary")] if "md-sidebar--secondary" in nav else nav
        links = re.findall(r'<a href="([^"]*)"[^>]*class="md-nav__link[^"]*"', nav)
        home = [t for t in links if not t.startswith("#") and (page.parent / t).resolve() in
                (site.resolve(), (site / "index.html").resolve())]
        assert len(home) == 1, f"{page.relative_to(site)}: the index is linked {len(home)} times in the navigation"
        tops = [t for t in links if not t.startswith("#")]
        assert len(tops) == len(set(tops)), f"pages listed twice: {sorted(t for t in tops if tops.count(t) > 1)}"


def test_api_pages_show_what_each_argument_means(built):
    "The API pages list each export with its signature, docstring and the docments comment of every argument."
    site = built / "site"
    html = (site / "api" / "data" / "index.html").read_text(encoding="utf-8")
    i = html.index('id="load_mnist"')
    block = html[i:html.index("<h2", i + 10)]
    assert "def" not in block.split("</code>")[0] and "split" in block
    row = re.search(r"<td><code>root</code></td>.*?</tr>", block, re.S)
    assert row and "full MNIST folder" in row.group(0), block[:2000]
    assert "a user&#39;s full copy when given" in block or "a user's full copy when given" in block
    home = (site / "index.html").read_text(encoding="utf-8")
    assert 'href="api/data/"' in home and 'href="api/core/"' in home


def test_wide_code_scrolls(built):
    site = built / "site"
    css = (site / "assets" / "genlab.css").read_text()
    for sel in (".highlight-ipynb pre", ".jp-OutputArea-output pre"):
        block = next(b for b in css.split("}") if sel in b)
        assert "overflow-x: auto" in block and "white-space: pre" in block, sel
    assert 'assets/genlab.css"' in (site / "10_flow_matching" / "index.html").read_text(encoding="utf-8")


def test_build_docs_uses_mkdocs_from_env_then_path(tmp_path):
    proj = tmp_path / "p"
    (proj / "tools").mkdir(parents=True)
    shutil.copy2(ROOT / "tools" / "build_docs.sh", proj / "tools" / "build_docs.sh")
    fake = tmp_path / "bin"
    fake.mkdir()
    for name, path in (("mkdocs", fake / "mkdocs"), ("explicit", tmp_path / "explicit-mkdocs")):
        path.write_text(f'#!/usr/bin/env bash\necho "{name} $*" >> "{tmp_path}/calls"\n')
        path.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "MKDOCS"}
    env["PATH"] = f"{fake}:{env['PATH']}"
    res = subprocess.run(["bash", "tools/build_docs.sh"], cwd=proj, env=env, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    res = subprocess.run(["bash", "tools/build_docs.sh"], cwd=proj, capture_output=True, text=True,
                         env=dict(env, MKDOCS=str(tmp_path / "explicit-mkdocs")))
    assert res.returncode == 0, res.stderr
    calls = (tmp_path / "calls").read_text().splitlines()
    assert calls[0].startswith("mkdocs build") and calls[1].startswith("explicit build"), calls


def test_stage_prefers_executed_report_and_falls_back(tmp_path, monkeypatch):
    "Staging on a tiny project: the executed run becomes the page, a method without one shows its source."
    hooks = _hooks()
    proj = tmp_path / "proj"
    (proj / "nbs").mkdir(parents=True)
    (proj / "README.md").write_text("# demo\n")

    def nb(title, extra=None):
        return {"cells": [{"cell_type": "markdown", "id": "a", "metadata": {}, "source": f"# {title}\n\n$$x^2$$"}],
                "metadata": extra or {}, "nbformat": 4, "nbformat_minor": 5}
    (proj / "nbs" / "10_alpha.ipynb").write_text(json.dumps(nb("Alpha")))
    (proj / "nbs" / "11_beta.ipynb").write_text(json.dumps(nb("Beta")))
    (proj / "nbs" / "index.ipynb").write_text(json.dumps(nb("demo")))
    for run, end, preset in (("alpha-old", "2026-01-01T00:00:00", "full"), ("alpha-new", "2026-02-01T00:00:00", "full"),
                             ("alpha-smoke", "2026-03-01T00:00:00", "smoke")):
        d = proj / "reports" / "alpha" / run
        d.mkdir(parents=True)
        (d / "alpha.ipynb").write_text(json.dumps(nb(f"Alpha {run}", {"papermill": {"end_time": end},
                                                                      "widgets": {"state": {}}})))
        (d / "record.json").write_text(json.dumps({"id": run, "preset": preset, "status": "ok", "commit": "abc"}))
    (proj / "reports" / "report_files").mkdir()
    (proj / "reports" / "report_files" / "alpha-new_0.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    (proj / "reports" / "report.md").write_text(
        "# report\n\nExecuted notebook: [x](alpha/alpha-new/alpha.ipynb)\n\nold: [y](alpha/alpha-old/alpha.ipynb)\n\n"
        "![fig](report_files/alpha-new_0.png)\n\ngone: [z](beta/beta-gone/beta.ipynb)\n")
    mj = tmp_path / "mj" / "es5"
    mj.mkdir(parents=True)
    (mj / "tex-svg-full.js").write_text("/* MathJax */")
    monkeypatch.setenv("GENLAB_MATHJAX", str(mj.parent))
    docs = proj / "_docs" / "src"
    out = hooks.stage(proj, docs)

    alpha = json.loads((docs / "10_alpha.ipynb").read_text())
    assert alpha["cells"][0]["source"].startswith("# Alpha alpha-new")      # the latest full run, not the smoke one
    assert "Executed notebook" in alpha["cells"][1]["source"] and "widgets" not in alpha["metadata"]
    beta = json.loads((docs / "11_beta.ipynb").read_text())
    assert beta["cells"][0]["source"].startswith("# Beta") and "no executed full-preset report" in beta["cells"][1]["source"]
    report = (docs / "report" / "index.md").read_text()
    assert "[x](../10_alpha.ipynb)" in report                                # to the rendered method page
    assert "[y](alpha/alpha-old/alpha.ipynb)" in report                      # kept, and the file is copied
    assert "[z](../11_beta.ipynb)" in report                                 # a run no longer there: its method page
    assert (proj / "reports" / "alpha" / "alpha-old" / "alpha.ipynb", "report/alpha/alpha-old/alpha.ipynb") in out["extra"]
    assert (docs / "report" / "report_files" / "alpha-new_0.png").is_file()
    assert (docs / "assets" / "mathjax" / "tex-svg-full.js").is_file()
    flat = json.dumps(out["nav"])
    assert flat.count('"index.md"') == 1 and "index.ipynb" not in flat and flat.count("reading.ipynb") == 1
    monkeypatch.setenv("GENLAB_MATHJAX", str(tmp_path / "nowhere"))
    monkeypatch.setattr(hooks.sys, "prefix", str(tmp_path / "noprefix"))
    monkeypatch.setattr(hooks, "__file__", str(tmp_path / "x" / "tools" / "mkdocs_hooks.py"))
    with pytest.raises(hooks.DocsError, match="npm install"):
        hooks.find_mathjax()


def test_headless_chromium_finds_rendered_maths_and_figures(built, tmp_path):
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import check_site
    finally:
        sys.path.pop(0)
    chromium = check_site.find_chromium()
    if chromium is None:
        pytest.fail("no Chromium binary on PATH: install chromium (apt-get update && apt-get install -y chromium; "
                    "tools/install.sh does this) to run the headless-browser check of the docs site")
    site = built / "site"
    res = subprocess.run([sys.executable, str(ROOT / "tools" / "check_site.py"), str(site)],
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    assert re.search(r"typeset [1-9]\d* equations \(0 TeX errors", res.stdout), res.stdout
    assert re.search(r"; [1-9]\d* embedded figures", res.stdout), res.stdout
    # the check can fail: the same page without the shipped MathJax shows no rendered maths
    broken = tmp_path / "site"
    shutil.copytree(site / "assets", broken / "assets", ignore=shutil.ignore_patterns("tex-svg-full.js"))
    shutil.copytree(site / "10_flow_matching", broken / "10_flow_matching")
    res = subprocess.run([sys.executable, str(ROOT / "tools" / "check_site.py"), str(broken), "--no-report"],
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 1 and "no rendered maths" in res.stderr, res.stdout + res.stderr


def test_site_leaves_out_progress_bars_and_echoed_captions():
    hooks = _hooks()
    bar = {"output_type": "display_data", "data": {"application/vnd.jupyter.widget-view+json": {"model_id": "x"},
                                                   "text/plain": ["TinyGPT:   0%|          | 0/1200 [00:00<?, ?it/s]"]}}
    err = {"output_type": "stream", "name": "stderr", "text": "fit:  10%|#   | 30/300 [00:01<00:09]\rfit:  20%|##  | 60/300"}
    warn = {"output_type": "stream", "name": "stderr", "text": "UserWarning: 50% of the rows | 3/30 dropped\n"}
    fig = {"output_type": "display_data", "data": {"image/png": "iVBOR", "text/plain": "<Figure>"}}
    cap = {"output_type": "display_data", "data": {"application/vnd.genlab.record+json": {"kind": "caption", "text": "Paths."},
                                                   "text/plain": "Figure: Paths."}}
    echo = {"output_type": "execute_result", "data": {"text/plain": "'Paths.'"}}
    value = {"output_type": "execute_result", "data": {"text/plain": "'another string'"}}
    nb = {"metadata": {"widgets": {}}, "cells": [{"cell_type": "code", "outputs": [bar, err, warn, fig, cap, echo, value]}]}
    assert hooks._strip_for_site(nb)["cells"][0]["outputs"] == [warn, fig, cap, value] and "widgets" not in nb["metadata"]


def test_colour_verdicts_marks_verdict_cells_and_nonzero_tally_counts():
    hooks = _hooks()
    html = hooks.colour_verdicts("<td>supported</td><td>8 / 0 / 3 (11)</td><td>text</td>")
    assert html == ('<td class="genlab-supported">supported</td><td><span class="genlab-supported">8</span> / 0 / '
                    '<span class="genlab-unresolved">3</span> (11)</td><td>text</td>')


def test_report_page_colours_verdicts_and_its_tables_scroll(built):
    html = (built / "site" / "report" / "index.html").read_text(encoding="utf-8")
    assert re.search(r'<td class="genlab-(supported|contradicted|unresolved)">', html)
    assert re.search(r'<td><span class="genlab-supported">\d+</span> / ', html)  # the summary's tally, coloured
    css = next((built / "site" / "assets").glob("genlab.css")).read_text()
    assert re.search(r"\.md-typeset__scrollwrap \{ overflow-x: auto; \}", css)
    for stem in _method_slugs(built).values():             # no frozen progress bar on an executed page
        page = (built / "site" / stem / "index.html").read_text(encoding="utf-8")
        assert not re.search(r"\d+%\|[^<|]*\|\s*\d+/\d+", page), stem
