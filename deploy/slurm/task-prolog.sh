#!/usr/bin/env bash
# Slurm TaskProlog: netopt's NCCL settings for this job's nodes, in every task's environment.
# slurm.conf:  TaskProlog=/etc/slurm/netopt-task-prolog.sh
# A Prolog cannot change a job's environment (it runs in slurmd's); a TaskProlog runs
# as the job's user before each task, and Slurm adds what it prints as
# "export NAME=value" to that task's environment (values taken literally).
# The settings are tuned once per job and node (cached under $TMPDIR), from the
# coordinator's live link figures, for this node (its own interface names).
# Never fails a task: on an error it prints one "print" line (into the task's
# output) and no exports, so NCCL keeps its own defaults.
#   NETOPT               netopt executable            (default /opt/netopt/bin/netopt)
#   NETOPT_COORDINATOR   coordinator URL              (default http://127.0.0.1:7460)
#   NETOPT_TOKEN_FILE    coordinator token file       (default: NETOPT_TOKEN from the env)
#   NETOPT_LINKS         a links file instead of the coordinator
#   NETOPT_NODES         node names, comma-separated  (default: scontrol show hostnames)
set -u
NETOPT=${NETOPT:-/opt/netopt/bin/netopt}
node=${SLURMD_NODENAME:-$(hostname -s)}
if [ -n "${NETOPT_NODES:-}" ]; then
  nodes=$NETOPT_NODES
elif command -v scontrol >/dev/null 2>&1; then
  nodes=$(scontrol show hostnames "${SLURM_JOB_NODELIST:-}" | paste -sd, -)
else
  nodes=${SLURM_JOB_NODELIST:-}
fi
if [ -n "${NETOPT_LINKS:-}" ]; then
  from=(--links "$NETOPT_LINKS")
else
  from=(--coordinator "${NETOPT_COORDINATOR:-http://127.0.0.1:7460}")
  [ -n "${NETOPT_TOKEN_FILE:-}" ] && from+=(--token-file "$NETOPT_TOKEN_FILE")
fi
cache="${TMPDIR:-/tmp}/netopt-nccl.${SLURM_JOB_ID:-nojob}.${node}"
if [ ! -s "$cache" ]; then
  tmp=$(mktemp "${cache}.XXXXXX") || { echo "print netopt task prolog: cannot write ${TMPDIR:-/tmp}"; exit 0; }
  if ! "$NETOPT" nccl-env --nodes "$nodes" "${from[@]}" --node "$node" --format slurm \
      >"$tmp" 2>"$tmp.err"; then
    echo "print netopt task prolog: nccl-env failed, NCCL settings left as they were: $(tail -n 1 "$tmp.err")"
    rm -f "$tmp" "$tmp.err"
    exit 0
  fi
  rm -f "$tmp.err"
  mv -f "$tmp" "$cache"
fi
cat "$cache"
exit 0
