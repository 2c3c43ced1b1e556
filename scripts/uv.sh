#!/usr/bin/env bash
# Run uv for the recipes: the uv on PATH, else the pinned one this script installed, else `python3 -m uv`; when there is
# none, install the pinned uv with pip on first use (idempotent). It goes into a folder of its own, never onto PATH
# (pip --target: no venv module needed, allowed where the system Python is externally managed, PEP 668).
# DUCKLAKE_UV tells the commands uv runs (doctor) which uv that was: a path, or `<python> -m uv`.
set -euo pipefail
UV_VERSION=0.13.8
# doctor looks here too (platforms/doctor.py: uv_home)
home="${DUCKLAKE_UV_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/ducklake-kit}"
pinned="$home/uv-$UV_VERSION/bin/uv"

run() { export DUCKLAKE_UV="$1"; shift; exec "$@"; }

if uv="$(command -v uv)"; then run "$uv" "$uv" "$@"; fi
if [ -x "$pinned" ]; then run "$pinned" "$pinned" "$@"; fi
command -v python3 >/dev/null || { echo "Error: python3 not found. Try: install Python 3.11+." >&2; exit 3; }
python="$(python3 -c 'import sys; print(sys.executable)')"  # the interpreter itself, not a shim
if "$python" -m uv --version >/dev/null 2>&1; then run "$python -m uv" "$python" -m uv "$@"; fi

echo "uv not found: installing the pinned uv==$UV_VERSION with pip into $home/uv-$UV_VERSION (not on PATH)" >&2
mkdir -p "$home"
tmp="$home/.installing-$$"  # filled, then renamed: a half-done install is never taken for a done one
trap 'rm -rf "$tmp"' EXIT
PIP_ROOT_USER_ACTION=ignore "$python" -m pip install --quiet --disable-pip-version-check --target "$tmp" "uv==$UV_VERSION" \
  && "$tmp/bin/uv" --version >/dev/null \
  || { echo "Error: could not install uv==$UV_VERSION with \`$python -m pip\`. Try: install pip for python3 (e.g. \`sudo apt-get install python3-pip\`), or uv itself (https://docs.astral.sh/uv/getting-started/installation/)." >&2; exit 3; }
mv -T "$tmp" "$home/uv-$UV_VERSION" 2>/dev/null || true  # another run may have finished first: its copy is the same
rm -rf "$tmp"
trap - EXIT
run "$pinned" "$pinned" "$@"
