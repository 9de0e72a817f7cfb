#!/usr/bin/env bash
# Run on a machine with the dev venv and a package index, before benchmarks/gpu_lease.py runs on a GPU machine that
# has torch, timm, tensorboard and OpenCV but may reach no index: rsnet's other dependencies go beside the checkout
# as wheels (.whl/, for that machine's Python 3.12), and the real-data set as a copy (.aid-dev/). Both folders are
# git-ignored: copy them along with the checkout. See docs/scheduler.md.
#
#   bash benchmarks/prepare_gpu_lease.sh [aid-dev folder]      # default: ../shared/data/aid-dev
#   LEASE_PYTHON=3.11 WHEELS=/tmp/wheels311 bash benchmarks/prepare_gpu_lease.sh   # wheels for another Python
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
AID_DEV=${1:-../shared/data/aid-dev}
LEASE_PYTHON=${LEASE_PYTHON:-3.12}  # the device image's Python
WHEELS=${WHEELS:-.whl}
# The versions the test suite ran with here, so the GPU runs the code under the same libraries.
packages=$("$PY" - <<'PYTHON'
from importlib.metadata import version
names = ["albumentations", "albucore", "pydantic", "pydantic_core", "annotated-types", "typing-inspection",
         "typing_extensions", "simsimd", "stringzilla", "hydra-core", "omegaconf", "matplotlib", "contourpy",
         "cycler", "fonttools", "kiwisolver", "pyparsing", "python-dateutil", "filelock", "colorcet"]
print(" ".join(f"{name}=={version(name)}" for name in names))
PYTHON
)
antlr=$("$PY" -c 'from importlib.metadata import version; print(version("antlr4-python3-runtime"))')
rm -rf "$WHEELS" && mkdir -p "$WHEELS"
# shellcheck disable=SC2086
"$PY" -m pip download --quiet --no-deps --only-binary=:all: --python-version "$LEASE_PYTHON" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$WHEELS" $packages
"$PY" -m pip wheel --quiet --no-deps -w "$WHEELS" "antlr4-python3-runtime==$antlr"  # published as a source archive only
rm -rf .aid-dev && cp -r "$AID_DEV" .aid-dev
echo "ready: $WHEELS ($(ls "$WHEELS" | wc -l) wheels, $(du -sh "$WHEELS" | cut -f1)), .aid-dev ($(du -sh .aid-dev | cut -f1))"
echo "next, on the GPU machine with .whl and .aid-dev beside the checkout: python3 benchmarks/gpu_lease.py"
