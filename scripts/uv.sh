#!/usr/bin/env bash
# Run uv: the one on PATH, else the pinned one from PyPI, installed with pip on first use (idempotent).
set -euo pipefail
UV_VERSION=0.13.8
if command -v uv >/dev/null 2>&1; then exec uv "$@"; fi
if ! python3 -m uv --version >/dev/null 2>&1; then
  echo "uv not found: installing uv==$UV_VERSION with pip" >&2
  python3 -m pip install --quiet --user "uv==$UV_VERSION" 2>/dev/null \
    || python3 -m pip install --quiet "uv==$UV_VERSION" \
    || { echo "Error: could not install uv with pip. Try: pipx install uv (or see https://docs.astral.sh/uv/getting-started/installation/)." >&2; exit 3; }
fi
exec python3 -m uv "$@"
