"""`genlab.plot.explore` as people meet it: a static snapshot (an image, nothing else) wherever a notebook is executed
without a frontend (plain papermill, nbclient, nbdev_test's in-process shell), and a live widget in JupyterLab driven
in a real browser (the template notebook run from the Run menu, one control moved, the figure redrawn)."""
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
WIDGET = "application/vnd.jupyter.widget-view+json"

# The explorer cell ends with the explore(...) call, so anything it returned would be saved as an execute_result.
EXPLORER_CELLS = [
    "import matplotlib.pyplot as plt\nimport ipywidgets as widgets\nfrom genlab.plot import explore\n"
    "from genlab.record import record\ncalls = []",
    "def _show(nfe_index=0, steps=1, coupling=\"ot\"):\n"
    "    calls.append((nfe_index, steps, coupling))\n"
    "    fig, ax = plt.subplots(figsize=(2, 2))\n"
    "    ax.plot(range(steps + nfe_index))\n"
    "    ax.set_title(f\"{coupling}, {steps} steps\")\n"
    "    plt.show()\n\n"
    "explore(_show, nfe_index=widgets.IntSlider(2, 0, 3), steps=[4, 1, 16, 64], coupling=[\"ot\", \"independent\"])",
    "record(\"explorer_calls\", calls)",
]


def _fixture(path: Path) -> Path:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in EXPLORER_CELLS]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)
    return path


def _kernel_env(**extra) -> dict:
    "The caller's environment without the runner's switches: what a person typing `papermill` has."
    env = {k: v for k, v in os.environ.items() if k not in ("GENLAB_NONINTERACTIVE", "GENLAB_INTERACTIVE", "MPLBACKEND")}
    env.update(extra)
    return env


def _check_snapshot(outputs: list, record_outputs: list):
    "One PNG snapshot, no widget, no stray text (a returned function would print `<function _show(...)>`)."
    kinds = [o["output_type"] for o in outputs]
    assert sum("image/png" in o.get("data", {}) for o in outputs) == 1, kinds
    assert not any(WIDGET in o.get("data", {}) for o in outputs), "a widget-only output was saved"
    assert not [o for o in outputs if o["output_type"] == "execute_result"], "explore(...) returned something"
    texts = [o.get("text", "") if isinstance(o.get("text", ""), str) else "".join(o["text"]) for o in outputs]
    texts += ["".join(o.get("data", {}).get("text/plain", "")) for o in outputs]
    assert not any("<function" in t for t in texts), texts
    assert not [o for o in outputs if o["output_type"] == "error"], outputs
    calls = next(o["data"]["application/vnd.genlab.record+json"]["value"] for o in record_outputs
                 if "application/vnd.genlab.record+json" in o.get("data", {}))
    assert calls == [[2, 4, "ot"]], calls   # one call, with each control's default (the widget's value, the first option)


@pytest.mark.parametrize("backend", [None, "Agg"], ids=["default-backend", "Agg"])
def test_explorer_under_plain_papermill_saves_a_snapshot(tmp_path, backend):
    "`papermill in.ipynb out.ipynb` as typed in a shell (no genlab runner, no GENLAB_NONINTERACTIVE): a saved image."
    src, dst = _fixture(tmp_path / "in.ipynb"), tmp_path / "out.ipynb"
    env = _kernel_env(**({"MPLBACKEND": backend} if backend else {}))
    res = subprocess.run([str(BIN / "papermill"), "-k", "python3", str(src), str(dst)], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=180)
    assert res.returncode == 0, res.stderr[-3000:]
    cells = json.loads(dst.read_text())["cells"]
    _check_snapshot(cells[1]["outputs"], cells[2]["outputs"])


def test_explorer_under_nbclient_saves_a_snapshot(tmp_path):
    from nbclient import NotebookClient
    nb = nbformat.read(_fixture(tmp_path / "in.ipynb"), as_version=4)
    old = {k: os.environ.pop(k, None) for k in ("GENLAB_NONINTERACTIVE", "GENLAB_INTERACTIVE")}
    try:
        NotebookClient(nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    finally:
        os.environ.update({k: v for k, v in old.items() if v is not None})
    _check_snapshot(nb.cells[1]["outputs"], nb.cells[2]["outputs"])


def test_explorer_under_nbdev_test_shell_shows_a_snapshot(tmp_path):
    "nbdev_test runs cells in execnb's in-process CaptureShell: no kernel, no frontend, the snapshot is displayed."
    from execnb.nbio import read_nb
    from execnb.shell import CaptureShell
    nb = read_nb(_fixture(tmp_path / "in.ipynb"))
    sh = CaptureShell()
    sh.run_all(nb, exc_stop=True)
    _check_snapshot(nb.cells[1]["outputs"], nb.cells[2]["outputs"])


def test_explore_in_a_frontend_shows_values_and_redraws(monkeypatch):
    "The live path: one interactive widget displayed, nothing returned; a list of numbers is a slider showing them."
    import ipywidgets as widgets
    import IPython.display
    from genlab.plot import choice_slider, explore
    shown, calls = [], []
    monkeypatch.setenv("GENLAB_INTERACTIVE", "1")
    monkeypatch.delenv("GENLAB_NONINTERACTIVE", raising=False)
    monkeypatch.setattr(IPython.display, "display", lambda *objs, **kw: shown.extend(objs))
    out = explore(lambda steps, nfe_index, name: calls.append((steps, nfe_index, name)),
                  steps=[1, 4, 16, 64], nfe_index=choice_slider([8, 32], index=True), name=["a", "b"])
    assert out is None and len(shown) == 1 and isinstance(shown[0], widgets.interactive)
    steps, nfe, name = shown[0].kwargs_widgets
    assert isinstance(steps, widgets.SelectionSlider) and steps.description == "steps"
    assert [steps.label, nfe.label] == ["1", "8"] and calls == [(1, 0, "a")]
    steps.index = 3
    nfe.index = 1
    assert steps.label == "64" and nfe.label == "32" and calls[-1] == (64, 1, "a")


# ---- the template in JupyterLab, in the system Chromium --------------------------------------------------------

TEMPLATE = ROOT / "nbs" / "10_flow_matching.ipynb"
CHROMIUM = next((p for p in (shutil.which("chromium"), shutil.which("chromium-browser"), "/usr/bin/chromium")
                 if p and os.path.exists(p)), None)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def lab(tmp_path):
    "JupyterLab as `make lab` starts it (tools/lab.sh), on a copy of the template, with fresh user settings."
    work = tmp_path / "nbs"
    work.mkdir()
    shutil.copy(TEMPLATE, work / TEMPLATE.name)
    _fixture(work / "explorer.ipynb")
    settings = tmp_path / "settings" / "@jupyterlab" / "notebook-extension"
    settings.mkdir(parents=True)
    # every cell in the DOM (JupyterLab otherwise renders only the cells near the viewport)
    (settings / "tracker.jupyterlab-settings").write_text(json.dumps({"windowingMode": "none"}))
    port, token = _free_port(), uuid.uuid4().hex
    env = dict(os.environ, JUPYTERLAB_SETTINGS_DIR=str(tmp_path / "settings"),
               JUPYTERLAB_WORKSPACES_DIR=str(tmp_path / "workspaces"), JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"),
               JUPYTER=str(BIN / "jupyter"))
    log = open(tmp_path / "lab.log", "w")
    proc = subprocess.Popen(["bash", str(ROOT / "tools" / "lab.sh"), "--no-browser", f"--port={port}",
                             "--ServerApp.ip=127.0.0.1", f"--IdentityProvider.token={token}",
                             f"--ServerApp.root_dir={work}"], cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 60
        while True:
            try:
                urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2)
                break
            except OSError:
                if proc.poll() is not None or time.time() > deadline:
                    raise RuntimeError("JupyterLab did not start: " + (tmp_path / "lab.log").read_text()[-3000:])
                time.sleep(0.5)
        yield {"url": f"{base}/lab/tree/{TEMPLATE.name}?token={token}", "saved": work / TEMPLATE.name,
               "fixture_url": f"{base}/lab/workspaces/fixture/tree/explorer.ipynb?token={token}"}  # its own workspace
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


PROMPTS = "() => Array.from(document.querySelectorAll('.jp-CodeCell .jp-InputPrompt')).map(e => e.textContent.trim())"


ERRORS = ("() => Array.from(document.querySelectorAll(\".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']\"))"
          ".filter(e => e.textContent.includes('Traceback')).map(e => e.textContent.slice(0, 3000))")


def _run_all(page, url, timeout_ms):
    "Open a notebook, wait for its kernel, Run > Run All Cells, wait until every code cell has run (or one failed)."
    page.goto(url)
    page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=60_000)
    # The toolbar's indicator is idle before the kernel session is attached; Run All in that window opens
    # JupyterLab's "Select Kernel" dialog or runs nothing. Wait for the status bar's "<kernel> | Idle", accept the
    # dialog's preselected kernel if it is shown (as a user would), and click again until a cell has started.
    page.wait_for_function("() => /\\| Idle/.test(document.body.innerText)", timeout=60_000, polling=250)
    for attempt in range(4):
        dialog = page.locator(".jp-Dialog")
        if dialog.count():
            dialog.get_by_role("button", name="Select").click()
            page.wait_for_function("() => /\\| Idle/.test(document.body.innerText)", timeout=60_000, polling=250)
        page.locator(".lm-MenuBar-item", has_text="Run").first.click()
        page.locator(".lm-Menu-item", has_text="Run All Cells").first.click()
        try:
            page.wait_for_function(f"() => ({PROMPTS})().some(t => /^\\[(\\*|\\d+)\\]:$/.test(t))",
                                   timeout=15_000, polling=250)
            break
        except Exception:
            if attempt == 3:
                raise
    page.wait_for_function(f"() => ({PROMPTS})().every(t => /^\\[\\d+\\]:$/.test(t)) || ({ERRORS})().length > 0",
                           timeout=timeout_ms, polling=500)
    assert page.evaluate(ERRORS) == []
    page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=30_000)


def _move_slider(page, explorer, k):
    "Press the right arrow on the explorer's k-th slider; wait for the figure to be redrawn; return (readout before, after)."
    image = explorer.locator(".jp-OutputArea-output img").first
    image.wait_for(timeout=30_000)
    before = image.get_attribute("src")
    readout = explorer.locator(".widget-readout").nth(k)
    was = readout.inner_text()
    handle = explorer.locator(".noUi-handle").nth(k)
    handle.focus()
    handle.press("ArrowRight")
    page.wait_for_function("([el, src]) => { const i = el.querySelector('.jp-OutputArea-output img');"
                           " return i && i.getAttribute('src') !== src; }",
                           arg=[explorer.element_handle(), before], timeout=30_000, polling=200)
    assert "Traceback" not in explorer.inner_text()
    return was, readout.inner_text()


@pytest.mark.skipif(CHROMIUM is None, reason="no Chromium installed (apt-get install -y chromium; tools/install.sh does it)")
def test_template_explorer_is_live_in_jupyterlab(lab):
    "Run All in JupyterLab: no cell errors, the explorer is a widget with no stray output, moving a control redraws it."
    from playwright.sync_api import sync_playwright
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            shot = lab["saved"].parent.parent / "failure.png"
            _run_all(page, lab["url"], 150_000)  # about 30 s on an idle 2-core machine
            assert page.get_by_text("official Jupyter news").count() == 0, "the news pop-up is shown"
            explorer = page.locator(".widget-interact").first
            explorer.scroll_into_view_if_needed()
            outputs = page.locator(".jp-CodeCell", has=page.locator(".widget-interact")).first.locator(".jp-Cell-outputWrapper")
            assert "<function" not in outputs.inner_text()
            was, now = _move_slider(page, explorer, 0)
            assert was != now
            assert "<function" not in outputs.inner_text()

            page.keyboard.press("Control+s")                     # the saved notebook: every cell ran, no error output
            deadline = time.time() + 20
            while time.time() < deadline:
                cells = json.loads(lab["saved"].read_text())["cells"]
                if any(WIDGET in o.get("data", {}) for c in cells for o in c.get("outputs", [])):
                    break
                time.sleep(0.5)
            code = [c for c in cells if c["cell_type"] == "code"]
            assert all(c["execution_count"] for c in code)
            assert not [o for c in code for o in c["outputs"] if o["output_type"] == "error"]
            ex = next(c for c in code if "explore(" in "".join(c["source"]))
            assert [WIDGET in o.get("data", {}) for o in ex["outputs"]] == [True], ex["outputs"]

            # a list of values is a slider that shows the values it picks (steps=[4, 1, 16, 64]: 4, then 1)
            _run_all(page, lab["fixture_url"], 60_000)
            explorer = page.locator(".widget-interact").first
            assert [r.inner_text() for r in explorer.locator(".widget-readout").all()] == ["2", "4"]
            assert _move_slider(page, explorer, 1) == ("4", "1")
        except Exception:
            page.screenshot(path=str(shot))
            print(f"screenshot of the failure: {shot}")
            raise
        finally:
            browser.close()
