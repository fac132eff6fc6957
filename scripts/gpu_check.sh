#!/usr/bin/env bash
# The NCCL side on a real GPU, in one bounded run that always writes a JSON report.
#
#   scripts/gpu_check.sh [--out DIR] [--cpu] [--budget-s S]
#
# Steps (netopt/torch/gpucheck.py): netopt nccl-env for this machine's own interfaces,
# loaded with `set -a; . ./nccl.env`; a one-rank NCCL all-reduce with NCCL_DEBUG=INFO whose
# log must show every variable read and none rejected; the advised DDP comm hooks
# (bf16_compress_hook, PowerSGD) on CUDA; with 2+ GPUs a 2-rank bus bandwidth with and
# without the env file; netopt doctor finding the GPU through nvidia-smi.
#
# Python: $NETOPT_PYTHON, else ./.venv/bin/python, else ./.venv-gpucheck/bin/python, else
# python3 -- the first that imports torch (with CUDA, unless --cpu) and netopt's
# dependencies. If none does, it creates ./.venv-gpucheck (--system-site-packages) and runs
# `pip install torch==$NETOPT_TORCH_VERSION numpy .` (needs PyPI; bounded by
# $NETOPT_GPU_CHECK_SETUP_S, default 600 s, not part of the check's own budget);
# NETOPT_GPU_CHECK_NO_SETUP=1 reports the missing Python instead (offline machines).
#
# The check is bounded by --budget-s (default 270 s) and, around it, by `timeout`.
# Exit codes: 0 pass, 1 a check failed (or no usable Python), 2 bad arguments,
# 3 passed but some variables could not be confirmed from NCCL's log (listed in the report).
set -u
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT="$REPO/gpu-check"
CPU=""
BUDGET_S=270
while [ $# -gt 0 ]; do
  case "$1" in
    --out) OUT=${2:?--out needs a directory}; shift 2 ;;
    --cpu) CPU="--cpu"; shift ;;
    --budget-s) BUDGET_S=${2:?--budget-s needs seconds}; shift 2 ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "gpu_check.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
case "$BUDGET_S" in ''|*[!0-9]*) echo "gpu_check.sh: --budget-s takes whole seconds" >&2; exit 2 ;; esac
mkdir -p "$OUT" || exit 1
OUT=$(cd "$OUT" && pwd)
REPORT="$OUT/report.json"
MODE=cuda
[ -n "$CPU" ] && MODE=cpu
SETUP_S=${NETOPT_GPU_CHECK_SETUP_S:-600}
TORCH_VERSION=${NETOPT_TORCH_VERSION:-2.13.0}
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"

# A report even when no Python can run the check: $1 is the reason (JSON-escaped here).
fail_report() {
  local reason=${1//\\/\\\\}
  reason=${reason//\"/\\\"}
  reason=$(printf '%s' "$reason" | tr '\n\t' '  ')
  printf '{\n  "mode": "%s",\n  "verdict": "fail",\n  "steps": [{"name": "setup", "status": "fail", "reason": "%s"}],\n  "variables": []\n}\n' \
    "$MODE" "$reason" > "$REPORT.tmp" && mv "$REPORT.tmp" "$REPORT"
  echo "verdict: fail ($1); report: $REPORT" >&2
  exit 1
}

usable() {
  local want_cuda="assert torch.cuda.is_available(), 'no CUDA'"
  [ -n "$CPU" ] && want_cuda="pass"
  [ -x "$1" ] || command -v "$1" >/dev/null 2>&1 || return 1
  timeout 120 "$1" -c "import sys; assert sys.version_info >= (3, 11), 'Python 3.11+'
import torch, numpy, yaml, click, rich, aiohttp, netopt.cli.main
$want_cuda" >>"$OUT/setup.log" 2>&1
}

PY=""
for candidate in "${NETOPT_PYTHON:-}" "$REPO/.venv/bin/python" "$REPO/.venv-gpucheck/bin/python" python3; do
  [ -n "$candidate" ] || continue
  echo "trying $candidate" >>"$OUT/setup.log"
  if usable "$candidate"; then PY=$candidate; break; fi
done
if [ -z "$PY" ] && [ -n "${NETOPT_GPU_CHECK_NO_SETUP:-}" ]; then
  fail_report "no Python with torch$([ -z "$CPU" ] && echo ' (CUDA)') and netopt's dependencies, and NETOPT_GPU_CHECK_NO_SETUP is set: see $OUT/setup.log"
fi
if [ -z "$PY" ]; then
  echo "no usable Python: creating $REPO/.venv-gpucheck (pip install torch==$TORCH_VERSION)" >&2
  BASE=$(command -v python3.11 || command -v python3.12 || command -v python3.13 || command -v python3) \
    || fail_report "no python3 on PATH"
  timeout "$SETUP_S" "$BASE" -m venv --system-site-packages "$REPO/.venv-gpucheck" >>"$OUT/setup.log" 2>&1 \
    || fail_report "cannot create $REPO/.venv-gpucheck with $BASE (see $OUT/setup.log)"
  timeout "$SETUP_S" "$REPO/.venv-gpucheck/bin/python" -m pip install -q "torch==$TORCH_VERSION" numpy "$REPO" \
    >>"$OUT/setup.log" 2>&1 \
    || fail_report "pip install torch==$TORCH_VERSION numpy netopt failed or ran past ${SETUP_S} s (no PyPI?): $(tail -n 3 "$OUT/setup.log")"
  usable "$REPO/.venv-gpucheck/bin/python" \
    || fail_report "the new venv still cannot run the check: $(tail -n 3 "$OUT/setup.log")"
  PY="$REPO/.venv-gpucheck/bin/python"
fi
echo "python: $PY" >>"$OUT/setup.log"

rm -f "$REPORT"
timeout -k 5 "$((BUDGET_S + 20))" "$PY" -m netopt.torch.gpucheck --out "$OUT" --budget-s "$BUDGET_S" $CPU
rc=$?
if [ ! -s "$REPORT" ]; then
  fail_report "the check exited $rc without a report (killed past $((BUDGET_S + 20)) s?)"
fi
exit "$rc"
