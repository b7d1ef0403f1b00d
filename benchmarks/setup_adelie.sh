#!/usr/bin/env bash
# Creates benchmarks/.adelie-venv: a virtual environment of its own for the adelie peer
# (Yang & Hastie, "A Fast and Scalable Pathwise-Solver for Group Lasso and Elastic Net Penalized
# Regression via Block-Coordinate Descent", arXiv 2405.08631). adelie 1.1.52 needs numpy < 2, which
# the project's environment does not have, so benchmarks/bench_fista.py runs benchmarks/adelie_runner.py
# in this venv as a subprocess. Usage: bash benchmarks/setup_adelie.sh [python3]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
py="${1:-python3}"
"$py" -m venv "$here/.adelie-venv"
"$here/.adelie-venv/bin/pip" install --quiet "adelie==1.1.52" "numpy<2"
"$here/.adelie-venv/bin/python" -c \
    "import adelie, numpy; print('adelie', adelie.__version__, 'numpy', numpy.__version__)"
