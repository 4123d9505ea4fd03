#!/usr/bin/env bash
# Build the documentation site offline into site/ with mkdocs + mkdocs-material + mkdocs-jupyter (Quarto is not
# available here). The pages are assembled by tools/mkdocs_hooks.py: README as the index, the executed
# full-preset notebooks under reports/<slug>/ as the method pages (the unexecuted notebook where no report
# exists), the claims report with its figures, and MathJax 3 served from the site itself.
# mkdocs: $MKDOCS if set, else an mkdocs already on PATH, else .venv/bin/mkdocs.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -n "${MKDOCS:-}" ]; then
  mk="$MKDOCS"
elif command -v mkdocs >/dev/null 2>&1; then
  mk="$(command -v mkdocs)"
elif [ -x .venv/bin/mkdocs ]; then
  mk=.venv/bin/mkdocs
else
  echo "build_docs.sh: no mkdocs found (set MKDOCS, put mkdocs on PATH, or run tools/install.sh)" >&2
  exit 2
fi
mkdir -p _docs/src          # mkdocs checks docs_dir before the hooks rebuild its contents
start=$(date +%s)
NO_MKDOCS_2_WARNING=1 "$mk" build -q -f mkdocs.yml
echo "site built in site/ in $(( $(date +%s) - start )) s with $mk (open site/index.html)"
