#!/usr/bin/env bash
# Run the unit and service tests with every dependency at the minimum pyproject.toml declares
# (scripts/min_versions.py writes the pins), in a venv of its own (.venv-min), so a declared
# floor is one netopt really works with. .ci/run runs it after the main suite.
# Third-party DeprecationWarnings are not errors here: old releases use names their own
# dependencies have since deprecated (matplotlib 3.8 and pyparsing 3.3), which is not a
# netopt failure; the main suite keeps every warning an error.
#   bash scripts/test_min_versions.sh [pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
[ -x .venv-min/bin/python ] || "$PYTHON" -m venv .venv-min
.venv-min/bin/python -m pip install -q --upgrade pip
.venv-min/bin/python -m pip install -q "torch==${NETOPT_TORCH_VERSION:-2.13.0}"
constraints=$(mktemp)
trap 'rm -f "$constraints"' EXIT
"$PYTHON" scripts/min_versions.py > "$constraints"
.venv-min/bin/python -m pip install -q -c "$constraints" -e ".[torch,s3,demo,dev]"
echo "min-versions: $(tr '\n' ' ' < "$constraints")"
if [ $# -eq 0 ]; then set -- tests/unit tests/service; fi
.venv-min/bin/python -m pytest -p no:cacheprovider -W ignore::DeprecationWarning "$@"
