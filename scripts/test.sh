#!/usr/bin/env bash
# Install the test dependencies and run the whole test suite (what CI runs).
# Lab tests need root (network namespaces); without root they skip and say why.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --dev || exit 1
.venv/bin/python -m pytest "$@"
rc=$?
if [ $rc = 5 ]; then
  echo "test: pytest collected no tests: that is a failure" >&2
  exit 1
fi
exit $rc
