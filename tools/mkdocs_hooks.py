"""mkdocs hooks that assemble the genlab documentation site (used by mkdocs.yml; run by tools/build_docs.sh).

- stage the pages into `docs_dir` (`_docs/src`): README as the one index page, the executed full-preset notebook
  of each method (`reports/<slug>/**/<slug>.ipynb`) as its method page, or the unexecuted notebook from `nbs/`
  when no report exists, the core notebooks, and the claims report (`reports/report.md`, `report.html` and the
  `report_files/` images) with its "Executed notebook" links pointed at the rendered method pages;
- write one API page per generated module (signature, docstring, each argument's docments comment);
- write the navigation (each page once);
- ship MathJax 3 (the npm package `mathjax`, installed by tools/install.sh into the Python environment that runs
  mkdocs) into the site and render `$...$` / `$$...$$` in notebook and Markdown pages with it, offline;
- drop every script the notebook template would load from a CDN (mermaid, MathJax 2, widget managers);
- copy the raw executed notebooks and the records the report links to, so every link in report.html resolves.
"""
from __future__ import annotations

import ast
import io
import json
import logging
import os
import re
import shutil
import sys
import tokenize
from html import escape as html_escape
from pathlib import Path

log = logging.getLogger("mkdocs.hooks.genlab")
MATHJAX_VERSION = "3.2.2"
MATHJAX_FILES = ["tex-svg-full.js", "a11y", "input", "sre", "ui"]   # the combined component + what it may lazy-load
MATHJAX_CONFIG = r"""// MathJax 3 configuration for the genlab site (loaded before assets/mathjax/tex-svg-full.js, from this site).
window.MathJax = {
  tex: {
    inlineMath: [["\\(", "\\)"], ["$", "$"]],
    displayMath: [["\\[", "\\]"], ["$$", "$$"]],
    processEscapes: true,
    processEnvironments: true
  },
  options: {
    // page chrome and Markdown pages are skipped (their maths comes as pymdownx.arithmatex spans);
    // notebook Markdown cells and LaTeX outputs are typeset; code (pre/code) never is
    ignoreHtmlClass: "tex2jax_ignore|md-typeset|md-nav|md-header|md-footer|md-sidebar|md-search",
    processHtmlClass: "tex2jax_process|arithmatex|jp-RenderedMarkdown|jp-RenderedLatex"
  },
  svg: {fontCache: "global"},
  startup: {
    // mark the page once typesetting is done (tools/check_site.py reads it from the headless browser's DOM)
    pageReady: function () {
      return MathJax.startup.defaultPageReady().then(function () {
        document.body.setAttribute("data-mathjax-typeset", String(document.querySelectorAll("mjx-container").length));
      });
    }
  }
};
"""
SITE_CSS = """/* genlab site: wide code and output scroll sideways instead of being cut off */
.jupyter-wrapper .jp-InputArea-editor { width: auto; min-width: 0; overflow-x: auto; }
.jupyter-wrapper .jp-Cell-inputArea, .jupyter-wrapper .jp-OutputArea-child { min-width: 0; max-width: 100%; }
.jupyter-wrapper .highlight-ipynb, .jupyter-wrapper .highlight-ipynb pre,
.jupyter-wrapper .jp-OutputArea-output, .jupyter-wrapper .jp-OutputArea-output pre,
.jupyter-wrapper .jp-RenderedText pre { overflow-x: auto; white-space: pre; max-width: 100%; }
.jupyter-wrapper .jp-OutputArea-output img { max-width: 100%; height: auto; }
.md-typeset pre > code { overflow-x: auto; }
mjx-container[display="true"] { overflow-x: auto; overflow-y: hidden; max-width: 100%; }
.md-typeset__scrollwrap { overflow-x: auto; }     /* wide tables (the claims report's summary) scroll, never clip */
.md-typeset__table { max-width: none; }
.md-typeset table:not([class]) { display: table; max-width: none; }
.md-typeset td.genlab-supported { background: #e6f4ea; }  /* verdict colours, as on report.html */
.md-typeset td.genlab-contradicted { background: #fce8e6; }
.md-typeset td.genlab-unresolved { background: #fef7e0; }
.md-typeset span.genlab-supported { background: #e6f4ea; padding: 0 .3em; }  /* the summary's tally counts */
.md-typeset span.genlab-contradicted { background: #fce8e6; padding: 0 .3em; }
.md-typeset span.genlab-unresolved { background: #fef7e0; padding: 0 .3em; }
.genlab-banner { border-left: 4px solid var(--md-primary-fg-color, #3f51b5); padding: .4em .8em; margin: .5em 0 1em; }
"""
_NB_RE = re.compile(r"^(\d\d)[a-z]?_(\w+)\.ipynb$")
_MD_LINK = re.compile(r"(!?\[[^\]]*\]\()([^)\s]+)(\))")
_HTML_LINK = re.compile(r"""((?:href|src)=["'])([^"'#?]+)(["'])""")
_REMOTE_SCRIPT = re.compile(r"<script\b[^>]*\bsrc=[\"']?(?:https?:)?//[^>]*>\s*</script>", re.I | re.S)
_EMPTY_SCRIPT = re.compile(r"<script\b[^>]*\bsrc=[\"']{2}[^>]*>\s*</script>", re.I | re.S)
_MODULE_IMPORTING_REMOTE = re.compile(r"<script\b[^>]*>(?:(?!</script>).)*?import\(\s*[\"']https?://.*?</script>",
                                      re.I | re.S)
_MATHJAX2_CONFIG = re.compile(r"<script type=\"text/x-mathjax-config\">.*?</script>", re.S)


class DocsError(RuntimeError):
    "The site cannot be assembled; the message says what is missing and how to get it."


# ------------------------------------------------------------------------------------------------ MathJax
def find_mathjax() -> Path:
    "The `es5` folder of the npm `mathjax` package: $GENLAB_MATHJAX, or installed beside the Python running mkdocs."
    candidates = []
    if os.environ.get("GENLAB_MATHJAX"):
        candidates.append(Path(os.environ["GENLAB_MATHJAX"]))
    candidates += [Path(sys.prefix) / "share" / "genlab-docs" / "node_modules" / "mathjax",
                   Path(__file__).resolve().parents[1] / "node_modules" / "mathjax"]
    for c in candidates:
        for es5 in (c / "es5", c):
            if (es5 / "tex-svg-full.js").is_file():
                return es5
    raise DocsError(
        "MathJax is not installed for the docs build; looked in " + ", ".join(str(c) for c in candidates)
        + f". Run tools/install.sh, or: npm install --no-save --prefix {sys.prefix}/share/genlab-docs "
          f"mathjax@{MATHJAX_VERSION} (or set GENLAB_MATHJAX to a folder holding es5/tex-svg-full.js)")


def _copy_mathjax(dst: Path):
    es5 = find_mathjax()
    dst.mkdir(parents=True, exist_ok=True)
    for name in MATHJAX_FILES:
        src = es5 / name
        if src.is_dir():
            shutil.copytree(src, dst / name)
        elif src.is_file():
            shutil.copy2(src, dst / name)
    lic = es5.parent / "LICENSE"
    if lic.is_file():
        shutil.copy2(lic, dst / "LICENSE")


# ------------------------------------------------------------------------------------------------ notebooks
def _papermill_end(nb: dict) -> str:
    return str(nb.get("metadata", {}).get("papermill", {}).get("end_time") or "")


def executed_notebook(reports: Path, slug: str) -> Path | None:
    """The executed notebook shown for `slug`: among `reports/<slug>/**/<slug>.ipynb` whose record says preset
    `full` and status `ok` (or that has no record), the one papermill finished last."""
    best, best_key = None, None
    folder = reports / slug
    if not folder.is_dir():
        return None
    for nb_path in sorted(folder.rglob(f"{slug}.ipynb")):
        rec_path = nb_path.parent / "record.json"
        if rec_path.is_file():
            try:
                rec = json.loads(rec_path.read_text())
            except ValueError:
                continue
            if rec.get("preset") != "full" or rec.get("status") != "ok":
                continue
        try:
            nb = json.loads(nb_path.read_text())
        except ValueError:
            continue
        key = (_papermill_end(nb), str(nb_path))
        if best_key is None or key > best_key:
            best, best_key = nb_path, key
    return best


def _banner_cell(text: str) -> dict:
    return {"cell_type": "markdown", "id": "genlab-site-banner", "metadata": {}, "source": f'<div class="genlab-banner">\n\n{text}\n\n</div>'}


_PROGRESS = re.compile(r"\d+%\|.*\|\s*\d+/\d+")   # a tqdm line: "desc:  40%|####      | 1200/3000 [..]"


def _is_progress_bar(out: dict) -> bool:
    "A progress bar frozen in an executed notebook: a tqdm widget (its text fallback is the bar) or tqdm's stderr lines."
    data = out.get("data", {})
    if "application/vnd.jupyter.widget-view+json" in data:
        text = data.get("text/plain", "")
        return bool(_PROGRESS.search("".join(text) if isinstance(text, list) else str(text)))
    if out.get("output_type") == "stream" and out.get("name") == "stderr":
        lines = [l for l in re.split(r"[\r\n]", "".join(out.get("text", ""))) if l.strip()]
        return bool(lines) and all(_PROGRESS.search(l) for l in lines)
    return False


def _shown_texts(outputs: list[dict]) -> set[str]:
    "Texts a cell already displayed: markdown outputs and genlab captions (as shown, and as recorded)."
    texts = set()
    for o in outputs:
        data = o.get("data", {})
        for key in ("text/markdown", "text/plain"):
            if key in data and o.get("output_type") == "display_data":
                v = data[key]
                texts.add(("".join(v) if isinstance(v, list) else str(v)).strip())
        rec = data.get("application/vnd.genlab.record+json")
        if isinstance(rec, dict) and rec.get("kind") == "caption":
            texts.add(str(rec.get("text", "")).strip())
    return texts


def _is_echo(out: dict, shown: set[str]) -> bool:
    "An `Out[]` that repeats, as a quoted string, what the cell already displayed (older `md()`/`caption()` returned it)."
    if out.get("output_type") != "execute_result":
        return False
    v = out.get("data", {}).get("text/plain", "")
    v = ("".join(v) if isinstance(v, list) else str(v)).strip()
    try:
        text = ast.literal_eval(v) if v[:1] in "'\"" else None
    except (ValueError, SyntaxError):
        return False
    return isinstance(text, str) and bool(text.strip()) and text.strip() in shown


def _strip_for_site(nb: dict) -> dict:
    # widget state would make the template load a widget manager from a CDN; the outputs keep their snapshots
    nb.get("metadata", {}).pop("widgets", None)
    for cell in nb.get("cells", []):            # progress bars say nothing on a static page: leave them out
        if cell.get("outputs"):
            shown = _shown_texts(cell["outputs"])   # and a caption or note is shown once, not again as Out[]
            cell["outputs"] = [o for o in cell["outputs"] if not _is_progress_bar(o) and not _is_echo(o, shown)]
    return nb


def _stage_notebook(src_nb: Path, dst: Path, banner: str):
    nb = json.loads(src_nb.read_text(encoding="utf-8"))
    _strip_for_site(nb)
    cells = nb.get("cells", [])
    at = 1 if cells and cells[0].get("cell_type") == "markdown" else 0   # after the H1 title cell
    cells.insert(at, _banner_cell(banner))
    dst.write_text(json.dumps(nb), encoding="utf-8")


def _rel(path: Path, root: Path) -> str:
    try:
        return str(path.relative_to(root))
    except ValueError:
        return str(path)


# ------------------------------------------------------------------------------------------------ report
def _rewrite_links(text: str, pattern: re.Pattern, resolve) -> str:
    def sub(m):
        new = resolve(m.group(2))
        return m.group(1) + (new if new is not None else m.group(2)) + m.group(3)
    return pattern.sub(sub, text)


def _report_target(target: str, reports: Path) -> Path | None:
    if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I) or target.startswith(("/", "#")):
        return None
    p = (reports / target).resolve()
    try:
        p.relative_to(reports.resolve())
    except ValueError:
        return None
    return p if p.exists() else None


def _missing_run_link(target: str, pages_of_slug: dict, kind: str) -> str | None:
    """A report link to a run notebook `<slug>/<run>/<slug>.ipynb` that is not under reports/ (the run was removed
    or rerun after the report was written): point it at the method page instead, and say so."""
    m = re.match(r"^(\w+)/[^/]+/(\w+)\.ipynb$", target)
    if not m or m.group(1) != m.group(2) or m.group(1) not in pages_of_slug:
        return None
    page = pages_of_slug[m.group(1)]
    log.warning("the report links to %s, which is not under reports/; linking the method page %s instead",
                target, page)
    return "../" + (page if kind == ".ipynb" else Path(page).stem + "/")


# ------------------------------------------------------------------------------------------------ API pages
def _comments_by_line(src: str) -> dict[int, str]:
    out = {}
    try:
        for tok in tokenize.generate_tokens(io.StringIO(src).readline):
            if tok.type == tokenize.COMMENT:
                out[tok.start[0]] = tok.string.lstrip("#").strip()
    except (tokenize.TokenError, IndentationError, SyntaxError):
        pass
    return out


def _cell(text: str) -> str:
    return html_escape(text).replace("|", "&#124;").replace("\n", " ")


def _code(text: str) -> str:
    return f"<code>{_cell(text)}</code>" if text else ""


def _arg_rows(fn, comments: dict, skip_first: bool) -> list[tuple[str, str, str, str]]:
    "(name, type, default, meaning) per argument; the meaning is the docments comment on the argument's line."
    a = fn.args
    pos = a.posonlyargs + a.args
    rows = list(zip(pos, [None] * (len(pos) - len(a.defaults)) + list(a.defaults)))
    if a.vararg:
        rows.append((a.vararg, None))
    rows += list(zip(a.kwonlyargs, a.kw_defaults))
    if a.kwarg:
        rows.append((a.kwarg, None))
    if skip_first and rows and rows[0][0].arg in ("self", "cls"):
        rows = rows[1:]
    last_on_line = {}
    for arg, _ in rows:
        last_on_line[arg.lineno] = arg.arg
    out = []
    for arg, default in rows:
        star = "*" if arg is a.vararg else "**" if arg is a.kwarg else ""
        meaning = comments.get(arg.lineno, "") if last_on_line.get(arg.lineno) == arg.arg else ""
        out.append((star + arg.arg, ast.unparse(arg.annotation) if arg.annotation else "",
                    ast.unparse(default) if default is not None else "", meaning))
    return out


def _signature(fn) -> str:
    ret = f" -> {ast.unparse(fn.returns)}" if fn.returns else ""
    return f"{fn.name}({ast.unparse(fn.args)}){ret}"


def _fn_md(fn, comments: dict, level: str, prefix: str = "", method: bool = False) -> list[str]:
    md = [f"{level} `{prefix}{fn.name}`", "", "```python", _signature(fn), "```", ""]
    doc = ast.get_docstring(fn)
    if doc:
        md += [doc, ""]
    rows = _arg_rows(fn, comments, method)
    if rows:
        md += ["| argument | type | default | meaning |", "|---|---|---|---|"]
        md += [f"| {_code(n)} | {_code(t)} | {_code(d)} | {_cell(m) or '—'} |"
               for n, t, d, m in rows]
        md.append("")
    return md


def _class_md(cls, comments: dict) -> list[str]:
    bases = ", ".join(ast.unparse(b) for b in cls.bases)
    md = [f"## `{cls.name}`" + (f" ({html_escape(bases)})" if bases else ""), ""]
    doc = ast.get_docstring(cls)
    if doc:
        md += [doc, ""]
    fields = [n for n in cls.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)]
    if fields:
        md += ["| field | type | default | meaning |", "|---|---|---|---|"]
        for f in fields:
            md.append(f"| {_code(f.target.id)} | {_code(ast.unparse(f.annotation))} | "
                      f"{_code(ast.unparse(f.value) if f.value is not None else '')} | "
                      f"{_cell(comments.get(f.lineno, '')) or '—'} |")
        md.append("")
    for node in cls.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and \
                (not node.name.startswith("_") or node.name == "__init__"):
            if node.name == "__init__" and not _arg_rows(node, comments, True) and not ast.get_docstring(node):
                continue
            md += _fn_md(node, comments, "###", f"{cls.name}.", method=True)
    return md


def api_page(py: Path) -> tuple[str, str | None]:
    "Markdown for one generated module: every name in `__all__` with its signature, docstring and arguments."
    src = py.read_text(encoding="utf-8")
    tree = ast.parse(src)
    comments = _comments_by_line(src)
    names = None
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            try:
                names = list(ast.literal_eval(node.value))
            except ValueError:
                names = None
    m = re.search(r"File to edit: \.\./nbs/(\S+\.ipynb)", src)
    nb = m.group(1) if m else None
    md = [f"# genlab.{py.stem}", ""]
    doc = ast.get_docstring(tree)
    if doc:
        md += [doc, ""]
    if nb:
        md += [f"Generated from [nbs/{nb}](../{nb}) (the notebook is the source; this page lists its exports).", ""]
    defs = {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
    wanted = [n for n in (names if names is not None else defs) if not n.startswith("_")]
    consts = [n for n in wanted if n not in defs]
    if consts:
        md += ["Constants: " + ", ".join(f"`{c}`" for c in consts), ""]
    for name in wanted:
        node = defs.get(name)
        if isinstance(node, ast.ClassDef):
            md += _class_md(node, comments)
        elif node is not None:
            md += _fn_md(node, comments, "##")
    return "\n".join(md) + "\n", nb


def stage_api(root: Path, docs: Path, notebook_pages: set) -> list:
    "One API page per generated module, ordered as the notebooks are; returns the nav entries."
    entries = []
    (docs / "api").mkdir(exist_ok=True)
    for py in sorted((root / "genlab").glob("*.py")):
        if py.stem.startswith("_"):
            continue
        text, nb = api_page(py)
        if nb not in notebook_pages:                      # link only to notebooks that are pages of this site
            text = text.replace(f"[nbs/{nb}](../{nb})", f"`nbs/{nb}`")
        (docs / "api" / f"{py.stem}.md").write_text(text, encoding="utf-8")
        entries.append((nb or "zz" + py.stem, {f"genlab.{py.stem}": f"api/{py.stem}.md"}))
    return [e for _, e in sorted(entries, key=lambda t: t[0])]


# ------------------------------------------------------------------------------------------------ staging
def stage(root: Path, docs: Path) -> dict:
    "Write the site's sources into `docs`; return the nav and the files to copy into the site after the build."
    nbs, reports = root / "nbs", root / "reports"
    if docs.exists():
        shutil.rmtree(docs)
    docs.mkdir(parents=True)
    extra: list[tuple[Path, str]] = []          # (source file, path inside site/)
    page_of_executed: dict[Path, str] = {}      # executed notebook -> staged page source name
    methods, core = [], []
    pages_of_slug: dict[str, str] = {}         # slug -> staged page source name

    for nb in sorted(nbs.glob("*.ipynb")):
        m = _NB_RE.match(nb.name)
        if not m:
            continue
        num, slug = int(m.group(1)), m.group(2)
        stem = nb.stem
        executed = executed_notebook(reports, slug) if num >= 10 else None
        if executed is not None:
            rec = {}
            if (executed.parent / "record.json").is_file():
                rec = json.loads((executed.parent / "record.json").read_text())
            pm = json.loads(executed.read_text()).get("metadata", {}).get("papermill", {})
            dur = pm.get("duration")
            bits = [f"run `{rec.get('id', executed.parent.name)}`", f"preset `{rec.get('preset', 'full')}`"]
            if rec.get("seed") is not None:
                bits.append(f"seed {rec['seed']}")
            if rec.get("commit"):
                bits.append(f"commit `{str(rec['commit'])[:12]}`")
            if pm.get("end_time"):
                bits.append(f"finished {str(pm['end_time'])[:16].replace('T', ' ')} UTC")
            if isinstance(dur, (int, float)):
                bits.append(f"{dur / 60:.1f} min")
            banner = (f"**Executed notebook** ({', '.join(bits)}): the outputs and figures below are that run's. "
                      f"Source: `nbs/{nb.name}`; download the executed notebook: "
                      f"[{executed.name}]({executed.name}).")
            _stage_notebook(executed, docs / nb.name, banner)
            extra.append((executed, f"{stem}/{executed.name}"))
            page_of_executed[executed.resolve()] = nb.name
        else:
            note = ("no executed full-preset report exists yet, so this page shows the unexecuted notebook "
                    f"(`genlab run {slug} --preset full --out reports/{slug}` produces one)"
                    if num >= 10 else "a core notebook, shown unexecuted")
            _stage_notebook(nb, docs / nb.name,
                            f"**Source notebook** `nbs/{nb.name}`: {note}. Download: [{nb.name}]({nb.name}).")
            extra.append((nb, f"{stem}/{nb.name}"))
        title = _notebook_title(nb) or slug
        pages_of_slug[slug] = nb.name
        (methods if num >= 10 else core).append({(slug if num < 10 else title): nb.name})

    # README is the one index page
    readme = (root / "README.md").read_text(encoding="utf-8")
    (docs / "index.md").write_text(readme, encoding="utf-8")
    nav: list = [{"Home": "index.md"}]

    # the claims report, as written by `genlab report` (report.md, report.html, report_files/)
    report_dir = docs / "report"
    md_src, html_src = reports / "report.md", reports / "report.html"
    if md_src.is_file() or html_src.is_file():
        report_dir.mkdir()
        if (reports / "report_files").is_dir():
            shutil.copytree(reports / "report_files", report_dir / "report_files")

        def md_link(target):
            p = _report_target(target, reports)
            if p is None:
                return _missing_run_link(target, pages_of_slug, ".ipynb")
            if p.resolve() in page_of_executed:
                return "../" + page_of_executed[p.resolve()]
            if p.is_file() and not str(target).startswith("report_files/"):
                extra.append((p, "report/" + target))
            return None

        def html_link(target):
            p = _report_target(target, reports)
            if p is None:
                return _missing_run_link(target, pages_of_slug, "/")
            if p.resolve() in page_of_executed:
                return "../" + Path(page_of_executed[p.resolve()]).stem + "/"
            if p.is_file() and not str(target).startswith("report_files/"):
                extra.append((p, "report/" + target))
            return None

        head = ""
        if html_src.is_file():
            html = _rewrite_links(html_src.read_text(encoding="utf-8"), _HTML_LINK, html_link)
            (report_dir / "report.html").write_text(html, encoding="utf-8")
            head = "The same report as one standalone page: [report.html](report.html).\n\n"
        if md_src.is_file():
            text = _rewrite_links(md_src.read_text(encoding="utf-8"), _MD_LINK, md_link)
            lines = text.splitlines(keepends=True)
            at = 1 if lines and lines[0].startswith("# ") else 0
            text = "".join(lines[:at]) + ("\n" if at else "") + head + "".join(lines[at:])
        else:
            text = "# Claims report\n\n" + head
        (report_dir / "index.md").write_text(text, encoding="utf-8")
        nav.append({"Claims report": "report/index.md"})

    if (nbs / "index.ipynb").is_file():
        _stage_notebook(nbs / "index.ipynb", docs / "reading.ipynb",
                        "**Source notebook** `nbs/index.ipynb`.")
        nav.append({"How to read a method notebook": "reading.ipynb"})
    nav.append({"Methods": methods})
    nav.append({"Core library": core})
    if (root / "genlab").is_dir():
        nav.append({"API reference": stage_api(root, docs, {n.name for n in nbs.glob("*.ipynb")})})
    if (root / "DEVELOPING.md").is_file():
        shutil.copy2(root / "DEVELOPING.md", docs / "developing.md")
        nav.append({"Developing": "developing.md"})

    assets = docs / "assets"
    _copy_mathjax(assets / "mathjax")
    (assets / "mathjax-config.js").write_text(MATHJAX_CONFIG, encoding="utf-8")
    (assets / "genlab.css").write_text(SITE_CSS, encoding="utf-8")
    return {"nav": nav, "extra": extra}


def _notebook_title(path: Path) -> str | None:
    try:
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    except (ValueError, KeyError):
        return None
    for c in cells:
        if c.get("cell_type") == "markdown":
            for line in "".join(c.get("source", "")).splitlines():
                if line.startswith("# "):
                    return line[2:].strip()
    return None


# ------------------------------------------------------------------------------------------------ hooks
_STATE: dict = {}


def on_config(config, **kwargs):
    root = Path(config["config_file_path"]).resolve().parent
    docs = Path(config["docs_dir"]).resolve()
    if root not in docs.parents:
        raise DocsError(f"docs_dir {docs} must lie inside the project {root} (it is rebuilt on every build)")
    staged = stage(root, docs)
    _STATE.update(staged, root=root)
    config["nav"] = staged["nav"]
    return config


_VERDICT_CELL = re.compile(r"<td>((?:<strong>)?(supported|contradicted|unresolved)\b)")


_COUNTS_CELL = re.compile(r"<td>(\d+) / (\d+) / (\d+) \((\d+)\)</td>")


def _counts(m: re.Match) -> str:
    "supported / contradicted / unresolved (of): each nonzero count in its verdict's colour, as report.html has."
    parts = [f'<span class="genlab-{v}">{n}</span>' if int(n) else n
             for v, n in zip(("supported", "contradicted", "unresolved"), m.groups()[:3])]
    return f"<td>{' / '.join(parts)} ({m.group(4)})</td>"


def colour_verdicts(html: str) -> str:
    "Colour each table cell that starts with a verdict, and the nonzero counts of the summary's tally cells (as report.html)."
    html = _VERDICT_CELL.sub(lambda m: f'<td class="genlab-{m.group(2)}">{m.group(1)}', html)
    return _COUNTS_CELL.sub(_counts, html)


def on_post_page(output, page, config, **kwargs):
    "Remove scripts that would come from a CDN (and the empty MathJax-2 tag of the notebook template); colour verdicts."
    if page.file.src_uri.startswith("report/"):
        output = colour_verdicts(output)
    output = _REMOTE_SCRIPT.sub("", output)
    output = _EMPTY_SCRIPT.sub("", output)
    output = _MODULE_IMPORTING_REMOTE.sub("", output)
    output = _MATHJAX2_CONFIG.sub("", output)
    return output


def on_post_build(config, **kwargs):
    site = Path(config["site_dir"])
    for src, rel in _STATE.get("extra", []):
        dst = site / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dst)
