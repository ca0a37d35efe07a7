#!/usr/bin/env bash
# `make lab`: JupyterLab on this checkout, opened on nbs/. JupyterLab refuses to start as root unless told
# (--allow-root; containers and CI machines run as root), so the flag is added only then. The token is made
# here and printed first with the URL, so the link is known before the server's own log scrolls by.
# PORT (default 8888) and JUPYTER_TOKEN (default: 48 random hex digits) may be set by the caller.
set -euo pipefail
cd "$(dirname "$0")/.."
PORT="${PORT:-8888}"
JUPYTER_TOKEN="${JUPYTER_TOKEN:-$(.venv/bin/python -c 'import secrets; print(secrets.token_hex(24))')}"
export JUPYTER_TOKEN
flags=(--no-browser --ip=127.0.0.1 --port="$PORT" --ServerApp.port_retries=0 --ServerApp.root_dir=.)
[ "$(id -u)" = 0 ] && flags+=(--allow-root)
echo "JupyterLab: http://127.0.0.1:${PORT}/lab/tree/nbs?token=${JUPYTER_TOKEN}"
echo "token: ${JUPYTER_TOKEN}  (Ctrl-C stops the server)"
exec .venv/bin/jupyter lab "${flags[@]}"
