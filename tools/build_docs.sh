#!/usr/bin/env bash
# Build the documentation site offline with mkdocs + mkdocs-jupyter (Quarto is not available here).
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf _docs/src && mkdir -p _docs/src/reports
cp README.md _docs/src/index.md
cp nbs/*.ipynb _docs/src/
# executed full-preset notebooks, when present, so readers see real figures
if [ -d reports ]; then
  find reports -name '*.ipynb' | while read -r nb; do
    cp "$nb" "_docs/src/reports/$(basename "$(dirname "$(dirname "$nb")")")__$(basename "$nb")"
  done
fi
[ -f reports/report.md ] && cp reports/report.md _docs/src/reports/index.md || true
NO_MKDOCS_2_WARNING=1 ${MKDOCS:-.venv/bin/mkdocs} build -q -f mkdocs.yml
echo "site built in site/ (open site/index.html)"
