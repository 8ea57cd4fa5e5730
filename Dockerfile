# talkloop, CPU image: `talkloop serve` on the default avatar, or any other talkloop command.
# Build, run, ports, health check and volumes: docs/container.md.
#
#   docker build -t talkloop .
#   docker run --rm --network host talkloop     # page on http://127.0.0.1:8080/ (Linux hosts)
#
# Build arguments:
#   BASE             a Debian bookworm image, with or without Python 3.11 (installed when missing)
#   TORCH_INDEX      the index of the CPU torch build (torch's own index by default)
#   TORCH_VERSION    the torch release to install (the README's)
#   TALKLOOP_EXTRAS  optional extras of the project, e.g. "kvs" or "kvs,livekit"
#   PIP_INDEX_URL, PIP_EXTRA_INDEX_URL  another index for everything else (default: PyPI)
# Optional folders of the build context, used by the build stage only (never in the image):
#   wheels/  wheels pip may take: a torch-*.whl here is installed instead of TORCH_INDEX's, a
#            talkloop-*.whl instead of building the project from this source tree
#   pip/     pip/pip.conf, pip's settings for the build (e.g. a cert = /src/pip/ca.pem for a proxy)

ARG BASE=python:3.11-slim-bookworm

# -- what both stages share: Python 3.11, espeak-ng (speech at run time), the user -------------
# The user's config (TLS) and cache folders exist, so that named volumes there belong to it.
FROM ${BASE} AS base
RUN set -eux; \
    pkgs="espeak-ng"; \
    command -v python3 >/dev/null 2>&1 || pkgs="$pkgs python3 python3-venv"; \
    apt-get update; \
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $pkgs; \
    rm -rf /var/lib/apt/lists/* /var/cache/apt/archives/*.deb; \
    python3 -c 'import sys; assert sys.version_info[:2] >= (3, 11), sys.version'; \
    useradd --create-home --uid 10001 --user-group --shell /usr/sbin/nologin talkloop; \
    install -d -o talkloop -g talkloop /data /home/talkloop/.config/talkloop \
      /home/talkloop/.cache/talkloop
# here, while the image is small: each layer is a full copy under some storage drivers (vfs)
WORKDIR /data

# -- build stage: a venv at /opt/talkloop with torch (CPU) and the project (not editable) -------
FROM base AS build
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu TORCH_VERSION=2.13.0 TALKLOOP_EXTRAS= \
    PIP_INDEX_URL PIP_EXTRA_INDEX_URL
COPY . /src
RUN set -eux; \
    if [ -f /src/pip/pip.conf ]; then export PIP_CONFIG_FILE=/src/pip/pip.conf; fi; \
    export PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1; \
    python3 -m venv /opt/talkloop; \
    pip=/opt/talkloop/bin/pip; \
    torch_whl=$(ls /src/wheels/torch-*.whl 2>/dev/null | head -n 1 || true); \
    if [ -n "$torch_whl" ]; then \
      $pip install "$torch_whl"; \
    else \
      $pip install --index-url "$TORCH_INDEX" "torch==$TORCH_VERSION"; \
    fi; \
    project=$(ls /src/wheels/talkloop-*.whl 2>/dev/null | head -n 1 || true); \
    [ -n "$project" ] || project=/src; \
    find_links=""; [ -d /src/wheels ] && find_links="--find-links /src/wheels"; \
    $pip install $find_links "talkloop${TALKLOOP_EXTRAS:+[$TALKLOOP_EXTRAS]} @ file://$project"; \
    /opt/talkloop/bin/python -c 'import torch; assert torch.version.cuda is None, "not a CPU torch"'; \
    /opt/talkloop/bin/talkloop --help >/dev/null

# -- the image: the base plus the venv -------------------------------------------------------
# The settings first and the venv last: with the classic builder every instruction, even a
# setting, starts a container, which under vfs copies the whole image; here it is still small.
FROM base
ENV PATH=/opt/talkloop/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PYTHONUNBUFFERED=1 \
    HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1 \
    TALKLOOP_HOST=0.0.0.0 \
    TALKLOOP_PORT=8080 \
    TALKLOOP_SCHEME=http
USER talkloop
# The page and websockets (TCP). WebRTC media uses ephemeral UDP ports: docs/container.md.
EXPOSE 8080/tcp
# /healthz answers 200 once the models are loaded; TALKLOOP_PORT/TALKLOOP_SCHEME follow --port/TLS.
HEALTHCHECK --interval=15s --timeout=5s --start-period=180s --retries=3 \
    CMD ["python", "-c", "import os, ssl, urllib.request as u; e = os.environ.get; u.urlopen(f\"{e('TALKLOOP_SCHEME', 'http')}://127.0.0.1:{e('TALKLOOP_PORT', '8080')}/healthz\", timeout=4, context=ssl._create_unverified_context())"]
# --insecure: a container must listen on 0.0.0.0 to be published; keep it on loopback
# (-p 127.0.0.1:8080:8080) or give it a token and TLS (docs/container.md, Serving other machines).
CMD ["sh", "-c", "exec talkloop serve --host \"$TALKLOOP_HOST\" --port \"$TALKLOOP_PORT\" --insecure"]
COPY --from=build /opt/talkloop /opt/talkloop
