#!/usr/bin/env bash
# JupyterLab on genlab's notebooks (`make lab` runs `tools/lab.sh nbs/`; extra arguments go to `jupyter lab`).
# - No news pop-up: tools/jupyter is put first on JUPYTER_CONFIG_PATH, and its labconfig/page_config.json disables
#   the plugin @jupyterlab/apputils-extension:announcements, the one that asks "Would you like to get notified about
#   official Jupyter news?" on the first open (the way JupyterLab's docs give to turn it off); the server does not
#   check for updates either (--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate).
# - Inline figures: kernels get MPLBACKEND=module://matplotlib_inline.backend_inline, whatever the caller exported
#   (the Makefile exports Agg for the tests; ipykernel keeps a backend it finds set).
# - Live explorers: GENLAB_NONINTERACTIVE (the runner's switch to static snapshots) is cleared.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
export JUPYTER_CONFIG_PATH="$ROOT/tools/jupyter${JUPYTER_CONFIG_PATH:+:$JUPYTER_CONFIG_PATH}"
export MPLBACKEND=module://matplotlib_inline.backend_inline
unset GENLAB_NONINTERACTIVE
exec "${JUPYTER:-$ROOT/.venv/bin/jupyter}" lab --allow-root \
  --LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate "$@"
