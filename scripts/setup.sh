#!/usr/bin/env bash
# Install everything netopt needs on a fresh Debian machine with only Python and apt:
# system tools (apt; nginx-light and rclone are bench_transfer.py's peers), a virtualenv in
# .venv, netopt with its extras (torch, s3, bench: pyarrow for the corpus's Parquet; dev).
#   bash scripts/setup.sh          # runtime + torch extra (for `netopt demo`)
#   bash scripts/setup.sh --dev    # ... plus the test and lint tools
set -euo pipefail
cd "$(dirname "$0")/.."

dev=0
[ "${1:-}" = "--dev" ] && dev=1

APT_PACKAGES=(iperf3 iproute2 nftables ethtool iputils-ping procps psmisc curl rsync aria2 kmod chromium nginx-light rclone)
if [ $dev = 1 ]; then
  # tests/service/test_deploy.py: lint and render deploy/ (systemd-analyze, logrotate, kubectl
  # kustomize) and build the image where a registry can be reached (podman).
  APT_PACKAGES+=(systemd logrotate podman prometheus)  # prometheus: promtool
  # tests/pgserver.py: a throwaway PostgreSQL (initdb/pg_ctl) for the coordinator's store tests.
  APT_PACKAGES+=(postgresql)
  command -v kubectl >/dev/null || APT_PACKAGES+=(kubernetes-client)
fi
missing=()
for pkg in "${APT_PACKAGES[@]}"; do
  dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then SUDO=""; elif command -v sudo >/dev/null; then SUDO="sudo"; else SUDO=none; fi
  if [ "$SUDO" = none ]; then
    echo "setup: not root and no sudo; please install: ${missing[*]}" >&2
  else
    echo "setup: apt-get install ${missing[*]}"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
fi

PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
# torch first, pinned: the CPU build on this kind of machine; a bare `torch` would pull CUDA.
.venv/bin/python -m pip install -q "torch==${NETOPT_TORCH_VERSION:-2.13.0}"
if [ $dev = 1 ]; then
  .venv/bin/python -m pip install -q -e ".[torch,s3,bench,demo,dev]"
else
  .venv/bin/python -m pip install -q -e ".[torch,s3,bench,demo,postgres]"
fi
echo "setup: done ($(.venv/bin/netopt --version))"
