#!/usr/bin/env bash
# Runs the whole test suite: every notebook under nbval, tests/ under pytest (including the
# export/clean sync check and the docs build). Exit code 5 (nothing collected) counts as failure.
set -uo pipefail
cd "$(dirname "$0")/.."
n=${NAC_LAB_TEST_WORKERS:-2}
.venv/bin/python -m pytest -n "$n" --dist loadfile "$@"
rc=$?
if [ $rc -eq 5 ]; then echo "test: pytest collected no tests, which is a failure here" >&2; exit 1; fi
exit $rc
