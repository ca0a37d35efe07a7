#!/usr/bin/env bash
# Runs the whole test suite: every notebook under nbval, tests/ under pytest (including the
# export/clean sync check and the docs build), after ruff (make lint) on a full run. Exit code 5 (nothing collected) counts as failure.
# Then, on a full run (no arguments), a second pass re-runs the format fuzz/truncation tests under a
# deliberately long --basetemp: their inputs must not depend on where pytest puts temporary files.
set -uo pipefail
cd "$(dirname "$0")/.."
n=${NAC_LAB_TEST_WORKERS:-2}
if [ $# -eq 0 ]; then .venv/bin/ruff check -q nac_lab tests conftest.py tools || { echo "test: ruff found problems (make lint)" >&2; exit 1; }; fi
.venv/bin/python -m pytest -n "$n" --dist loadfile "$@"
rc=$?
if [ $rc -eq 5 ]; then echo "test: pytest collected no tests, which is a failure here" >&2; exit 1; fi
if [ $rc -ne 0 ] || [ $# -ne 0 ] || [ "${NAC_LAB_SECOND_PASS:-1}" = 0 ]; then exit $rc; fi
fuzz=(tests/test_*fuzz*.py tests/test_trillim_files.py tests/test_hostile_inputs.py)
top=$(mktemp -d "${TMPDIR:-/tmp}/nac_lab_basetemp.XXXXXX") || exit 1
long="$top/$(printf 'a_deliberately_long_basetemp_%s/' 1 2 3 4 5)x"
mkdir -p "$(dirname "$long")" || exit 1
echo "test: second pass of ${fuzz[*]} under --basetemp of ${#long} characters"
.venv/bin/python -m pytest -n "$n" --dist loadfile --basetemp "$long" "${fuzz[@]}"
rc=$?
rm -rf "$top"
exit $rc
