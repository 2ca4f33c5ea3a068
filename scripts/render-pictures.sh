#!/usr/bin/env bash
# Renders docs/pictures/*.dot to SVG with Graphviz's dot (Debian package `graphviz`); tests/test_pictures.py
# checks that the committed SVGs are what this renders. The plots have scripts of their own (docs/pictures/*.py).
set -euo pipefail
cd "$(dirname "$0")/.."
for source in docs/pictures/*.dot; do
  dot -Tsvg "$source" -o "${source%.dot}.svg"
done
