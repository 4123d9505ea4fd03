# genlab: every target installs what it needs first (into .venv).
SHELL := /bin/bash
VENV := .venv/bin
export OMP_NUM_THREADS ?= 1
export HF_HUB_OFFLINE := 1
export MPLBACKEND := Agg
export PATH := $(CURDIR)/.venv/bin:$(PATH)

.PHONY: install reproduce reproduce-full test test-fast docs lab bench export clean-nbs

install: .venv/.installed
.venv/.installed: settings.ini setup.py constraints.txt tools/install.sh
	bash tools/install.sh
	touch $@

reproduce: install          ## every method at the smoke preset, then the claims report
	$(VENV)/genlab reproduce --preset smoke --workers 2

reproduce-full: install     ## the full preset; writes reports/
	$(VENV)/genlab reproduce --preset full --workers 2 --out reports

test: install               ## unit, notebook (papermill smoke) and hygiene tests
	$(VENV)/python -m pytest -q --durations=20 tests

test-fast: install          ## unit tests only
	$(VENV)/python -m pytest -q tests --ignore=tests/test_notebooks.py --ignore=tests/test_hygiene.py

docs: install               ## static site from the notebooks and the executed reports, into site/
	bash tools/build_docs.sh

lab: install                ## JupyterLab on nbs/: live explorers, inline figures, no news pop-up (tools/lab.sh)
	bash tools/lab.sh nbs/

bench: install              ## genlab vs its peers (torchcfm, POT, scipy, transformers): one table of median per-round ratios, < 10 min
	$(VENV)/python tools/bench.py

export: install             ## notebooks -> genlab/, then clean the notebooks
	$(VENV)/nbdev_export && $(VENV)/nbdev_clean
