#!/usr/bin/env python3
"""Check the built documentation site in headless Chromium: a method page must show typeset equations and figures.

    python tools/check_site.py [SITE] [--page 10_flow_matching] [--screenshot out.png]

For each page it loads `SITE/<page>/index.html` with `chromium --headless --dump-dom` (after the page's scripts have
run: MathJax marks <body data-mathjax-typeset="N"> when it is done) and asserts
- MathJax ran and produced rendered maths (`<mjx-container>` elements), none of them a TeX error (`merror`);
- at least one figure: an <img> whose src is a data URI holding a valid PNG (or JPEG/SVG) of non-zero size;
- every image on the page loads, and wide code blocks scroll sideways (overflow-x auto) instead of being cut off;
- no script is loaded from another host (the site works offline).
The claims report page (report/) is checked too when it exists: its images must load.
Exit status 0 when every page passes, 1 when one fails, 2 when no Chromium binary is found.
"""
from __future__ import annotations

import argparse
import base64
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
INSTALL_HINT = "install Chromium first: apt-get update && apt-get install -y chromium (tools/install.sh does this)"
# Appended to a copy of the page (beside it, so relative links resolve): once MathJax has finished (or after 20 s),
# it records on <body> which images loaded and whether wide code blocks can scroll sideways.
PROBE = """<script>
(function () {
  var t0 = Date.now();
  function measure() {
    var imgs = Array.prototype.slice.call(document.querySelectorAll("article img"));
    var loaded = imgs.filter(function (i) { return i.complete && i.naturalWidth > 0; }).length;
    var article = document.querySelector("article") || document.body, wide = 0, cut = [];
    document.querySelectorAll("article pre").forEach(function (p) {
      var el = p, box = null;
      while (el && el !== document.documentElement) {
        if (getComputedStyle(el).overflowX !== "visible") { box = el; break; }
        el = el.parentElement;
      }
      var width = box ? box.clientWidth : article.clientWidth;
      if (p.scrollWidth <= width + 1) return;
      wide += 1;
      var o = box ? getComputedStyle(box).overflowX : "visible";
      if (o !== "auto" && o !== "scroll") cut.push((box ? box.tagName + "." + box.className : "PRE") + " overflow-x:" + o);
    });
    var b = document.body;
    b.setAttribute("data-probe-images", loaded + "/" + imgs.length);
    b.setAttribute("data-probe-wide-code", String(wide));
    b.setAttribute("data-probe-cut-code", cut.length + (cut.length ? " " + cut.slice(0, 3).join("; ") : ""));
  }
  function wait() {
    if (document.body.hasAttribute("data-mathjax-typeset") || Date.now() - t0 > 20000) { measure(); }
    else { setTimeout(wait, 100); }
  }
  window.addEventListener("load", function () { setTimeout(wait, 0); });
})();
</script>"""


def find_chromium(explicit: str | None = None) -> str | None:
    "The Chromium binary: `explicit`, $CHROMIUM, or the first of chromium / chromium-browser / google-chrome on PATH."
    for name in ([explicit] if explicit else []) + ([os.environ["CHROMIUM"]] if os.environ.get("CHROMIUM") else []) \
            + list(BROWSERS):
        path = shutil.which(name) or (name if Path(name).is_file() and os.access(name, os.X_OK) else None)
        if path:
            return path
    return None


def dump_dom(chromium: str, url: str, *, timeout: float = 240, budget_ms: int = 60000,
             screenshot: str | None = None) -> str:
    "The DOM of `url` after its scripts ran (virtual-time budget `budget_ms`), from headless Chromium."
    with tempfile.TemporaryDirectory(prefix="genlab-chromium-") as profile:
        base = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--no-first-run", "--no-default-browser-check", "--disable-extensions", "--mute-audio",
                f"--user-data-dir={profile}", f"--virtual-time-budget={budget_ms}"]
        res = subprocess.run(base + ["--dump-dom", url], capture_output=True, text=True, timeout=timeout)
        if res.returncode != 0 or not res.stdout.strip():
            raise RuntimeError(f"chromium failed on {url} (exit {res.returncode}): {res.stderr[-1500:]}")
        if screenshot:
            subprocess.run(base + ["--hide-scrollbars", "--window-size=1280,1600", f"--screenshot={screenshot}", url],
                           capture_output=True, text=True, timeout=timeout)
        return res.stdout


def _image_size(data: bytes, mime: str) -> tuple[int, int] | None:
    if mime == "image/png" and data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR":
        return struct.unpack(">II", data[16:24])
    if mime in ("image/jpeg", "image/jpg") and data[:2] == b"\xff\xd8":
        i = 2
        while i + 9 < len(data):
            if data[i] != 0xFF:
                return None
            marker, seg = data[i + 1], struct.unpack(">H", data[i + 2:i + 4])[0]
            if marker in (0xC0, 0xC1, 0xC2):
                h, w = struct.unpack(">HH", data[i + 5:i + 9])
                return w, h
            i += 2 + seg
        return None
    if mime.startswith("image/svg") and b"<svg" in data[:2000]:
        return (1, 1)
    return None


def inspect_dom(dom: str) -> dict:
    "Counts read from a rendered page's DOM: typeset equations, TeX errors, figure images, remote scripts, probe."
    def attr(name):
        m = re.search(r'<body[^>]*\b' + name + r'="([^"]*)"', dom)
        return m.group(1) if m else None
    figures, bad = [], 0
    for src in re.findall(r'<img\b[^>]*\bsrc="(data:[^"]+)"', dom):
        head, _, payload = src.partition(",")
        mime = head[5:].split(";")[0]
        try:
            data = base64.b64decode(payload) if ";base64" in head else payload.encode()
        except ValueError:
            bad += 1
            continue
        size = _image_size(data, mime)
        if size and size[0] > 0 and size[1] > 0:
            figures.append((mime, size))
        else:
            bad += 1
    typeset = attr("data-mathjax-typeset")
    images = attr("data-probe-images")
    return {
        "typeset_marker": int(typeset) if typeset is not None else None,
        "equations": len(re.findall(r"<mjx-container\b", dom)),
        "tex_errors": len(re.findall(r'<g\b[^>]*\bdata-mml-node="merror"|<mjx-merror\b', dom)),
        "raw_display_math": len(re.findall(r"\$\$[^$<]{1,400}\$\$", _text_outside_code(dom))),
        "figures": figures,
        "broken_data_images": bad,
        "images_loaded": tuple(int(x) for x in images.split("/")) if images else None,
        "wide_code": int(attr("data-probe-wide-code") or 0),
        "cut_code": attr("data-probe-cut-code"),
        "remote_scripts": re.findall(r'<script\b[^>]*\bsrc="((?:https?:)?//[^"]+)"', dom),
    }


def _text_outside_code(dom: str) -> str:
    dom = re.sub(r"<(script|style|pre|code|textarea)\b.*?</\1>", " ", dom, flags=re.S | re.I)
    return re.sub(r"<[^>]+>", " ", dom)


def render(chromium: str, html: Path, screenshot: str | None = None) -> dict:
    "Load a copy of `html` with the probe appended (beside it, then removed) and inspect the DOM Chromium built."
    probe = html.with_name(".check_site_probe.html")
    text = html.read_text(encoding="utf-8")
    probe.write_text(text.replace("</body>", PROBE + "</body>") if "</body>" in text else text + PROBE,
                     encoding="utf-8")
    try:
        return inspect_dom(dump_dom(chromium, probe.resolve().as_uri(), screenshot=screenshot))
    finally:
        probe.unlink(missing_ok=True)


def check_page(chromium: str, site: Path, page: str, *, maths: bool = True, screenshot: str | None = None) -> list[str]:
    """Problems found on `site/page/index.html` (empty when it passes); prints what was found. `maths`: the page
    must show typeset equations and at least one figure embedded in the page (a method page); otherwise (the
    report) at least one image must load."""
    html = site / page / "index.html"
    if not html.is_file():
        return [f"{html} does not exist (build the site with tools/build_docs.sh)"]
    info = render(chromium, html, screenshot)
    sizes = ", ".join(f"{w}x{h}" for _, (w, h) in info["figures"][:6])
    loaded, total = info["images_loaded"] or (0, 0)
    print(f"{page}: MathJax typeset {info['equations']} equations ({info['tex_errors']} TeX errors, "
          f"{info['raw_display_math']} raw $$...$$ left); {len(info['figures'])} embedded figures ({sizes}"
          f"{', ...' if len(info['figures']) > 6 else ''}); {loaded}/{total} images loaded; "
          f"{info['wide_code']} wide code blocks, cut off: {info['cut_code']}")
    problems = []
    if maths:
        if info["typeset_marker"] is None:
            problems.append("MathJax did not finish (no data-mathjax-typeset on <body>): the maths renderer did not load")
        if info["equations"] == 0:
            problems.append("no rendered maths (<mjx-container>) on the page")
        if info["raw_display_math"]:
            problems.append(f"{info['raw_display_math']} $$...$$ blocks were left as raw text")
        if not info["figures"]:
            problems.append("no figure: no <img> with a decodable image in a data URI")
    if info["tex_errors"]:
        problems.append(f"{info['tex_errors']} equations failed to typeset (MathJax merror)")
    if info["broken_data_images"]:
        problems.append(f"{info['broken_data_images']} <img> data URIs do not decode to an image")
    if info["images_loaded"] is None:
        problems.append("the page probe did not run (no data-probe-images on <body>)")
    elif total == 0 or loaded < total:
        problems.append(f"only {loaded} of {total} images loaded")
    if info["cut_code"] and not info["cut_code"].startswith("0"):
        problems.append(f"wide code is cut off instead of scrolling: {info['cut_code']}")
    if info["remote_scripts"]:
        problems.append(f"scripts from other hosts: {info['remote_scripts'][:3]}")
    return problems


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("site", nargs="?", default=str(ROOT / "site"), help="the built site folder (default: site/)")
    ap.add_argument("--page", action="append",
                    help="method page folder to check (maths and figures), repeatable (default: 10_flow_matching)")
    ap.add_argument("--no-report", action="store_true", help="skip the claims report page (report/)")
    ap.add_argument("--chromium", help="Chromium binary (default: $CHROMIUM or chromium on PATH)")
    ap.add_argument("--screenshot", help="also save a screenshot of the (first) page to this PNG file")
    args = ap.parse_args(argv)
    chromium = find_chromium(args.chromium)
    if chromium is None:
        print(f"check_site: no Chromium binary found; {INSTALL_HINT}", file=sys.stderr)
        return 2
    site = Path(args.site)
    failed = False
    pages = [(p, True) for p in (args.page or ["10_flow_matching"])]
    if not args.no_report and (site / "report" / "index.html").is_file():
        pages.append(("report", False))
    for i, (page, maths) in enumerate(pages):
        problems = check_page(chromium, site, page, maths=maths, screenshot=args.screenshot if i == 0 else None)
        for p in problems:
            print(f"FAIL {page}: {p}", file=sys.stderr)
        failed |= bool(problems)
    print("check_site: " + ("FAILED" if failed else "ok"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
