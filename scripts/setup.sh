#!/usr/bin/env bash
# Sets up talkloop in ./.venv: system packages (as root, with apt-get), the CPU build of
# PyTorch, then the project. `--test` adds the test dependencies, Chromium, Firefox ESR, coturn,
# docker.io, debootstrap, festival and festvox-kdlpc16k.
set -euo pipefail
cd "$(dirname "$0")/.."
extras=""
[ "${1:-}" = "--test" ] && extras="[test]"

need=()
command -v espeak-ng >/dev/null 2>&1 || need+=(espeak-ng)
# The browser tests drive Debian's Chromium and Firefox ESR (never a downloaded browser build).
if [ -n "$extras" ]; then
  [ -x /usr/bin/chromium ] || need+=(chromium)
  [ -x /usr/bin/firefox-esr ] || need+=(firefox-esr)
  # The TURN tests relay calls through a real coturn, started on loopback addresses only.
  command -v turnserver >/dev/null 2>&1 || need+=(coturn)
  # The container test builds the image on a dockerd of its own (Debian's: by path, not PATH)
  # from a debootstrapped base.
  [ -x /usr/sbin/dockerd ] && [ -x /usr/bin/docker ] || need+=(docker.io)
  [ -x /usr/sbin/debootstrap ] || need+=(debootstrap)
  # Training speech beyond espeak: Festival and a US English diphone voice (its tests).
  command -v festival >/dev/null 2>&1 || need+=(festival)
  [ -d /usr/share/festival/voices/english/ked_diphone ] || need+=(festvox-kdlpc16k)
fi
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "setup: please install ${need[*]} (as root: apt-get install -y ${need[*]})" >&2
    exit 1
  fi
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi

PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null 2>&1 || PY=python3
[ -x .venv/bin/python ] || "$PY" -m venv .venv
# torch first, pinned: an open range would pull the multi-GB CUDA build. Which build a pinned
# version gets depends on the index: here a local CPU wheel; on PyPI for Linux x86-64 the CUDA
# build (several GB; README, Setup). Say which one this is.
.venv/bin/pip install -q --disable-pip-version-check torch==2.13.0
.venv/bin/pip install -q --disable-pip-version-check -e ".${extras}"
.venv/bin/python -c 'import torch
cuda = torch.version.cuda
print(f"setup: torch {torch.__version__}, " + ("CPU build" if cuda is None else f"CUDA {cuda} build"))'
