#!/usr/bin/env bash
# Wheels for a GPU machine that has PyTorch (CUDA), Lightning and NumPy but no network: everything else lightrl and the
# GPU suite import, for that machine's Python, into ./.whl (git-ignored). Run from the checkout, on a machine with
# network access:
#
#   bash benchmarks/gpu_wheels.sh            # for Python 3.12 (the default)
#   PYTHON_VERSION=3.11 bash benchmarks/gpu_wheels.sh
#
# Then on the GPU machine, from the checkout with .whl copied beside it:
#
#   python3 -m pip install -q --no-index --no-deps --target .site .whl/*.whl && export PYTHONPATH=$PWD/.site:$PWD
#   python3 benchmarks/gpu_suite.py --out runs/gpu_suite
#
# The NES emulator (nes-py) publishes no wheels: it is built here, with a Python of the target version (found as
# pythonX.Y on PATH or under pyenv) and g++. Without one, the Mario item of the suite reports the missing package.
set -euo pipefail
version="${PYTHON_VERSION:-3.12}"
out=.whl
mkdir -p "$out"
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
grep -qx '/.site/' .git/info/exclude 2>/dev/null || echo '/.site/' >> .git/info/exclude
platforms=()
for glibc in 2_39 2_35 2_34 2_31 2_28 2_27 2_24 2_17; do platforms+=(--platform "manylinux_${glibc}_x86_64"); done
platforms+=(--platform manylinux2014_x86_64)
download() { python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$version" \
  --implementation cp "${platforms[@]}" -d "$out" "$@"; }
# lightrl's own dependencies beyond torch, lightning and numpy, and theirs.
download torchrl==0.14.1 tensordict==0.14.3 gymnasium==1.4.0 farama-notifications pyvers hoptorch orjson \
  importlib_metadata jsonargparse==4.53.0 docstring-parser typeshed-client
# MettaGrid and what it imports (its other requirements are never imported by lightrl's use of it).
download mettagrid==0.26.22 pydantic==2.14.4 pydantic_core==2.50.5 annotated-types typing-inspection importnb
# Mario: the game (pure Python), gym 0.26 (source only: built below) and the emulator.
download gym-super-mario-bros==7.4.0 gym-notices
python=""
for candidate in "python$version" "$HOME/.pyenv/versions/$version"*/bin/python; do
  if "$candidate" -c "" >/dev/null 2>&1; then python="$candidate"; break; fi
done
if [[ -n "$python" ]]; then
  "$python" -m pip wheel -q --no-deps -w "$out" nes-py==8.2.1 gym==0.26.2
else
  echo "no python$version found: nes-py and gym not built (the suite's Mario item will fail on import)" >&2
fi
ls "$out"
