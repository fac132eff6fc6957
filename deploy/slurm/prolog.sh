#!/usr/bin/env bash
# Slurm prolog: make sure the netopt agent runs on every node of a job.
# slurm.conf:  Prolog=/etc/slurm/prolog.d/netopt.sh   (runs as root on each allocated node)
# Uses the systemd unit where it is installed; otherwise starts the agent itself,
# once per node, with its pid in /run/netopt-agent.pid. Never fails the job: a
# missing agent costs measurements, not training.
set -u
NETOPT=${NETOPT:-/opt/netopt/bin/netopt}
CONFIG=${NETOPT_AGENT_CONFIG:-/etc/netopt/agent.yaml}
PIDFILE=/run/netopt-agent.pid
LOG=/var/log/netopt-agent.log

if systemctl cat netopt-agent.service >/dev/null 2>&1; then
  systemctl start netopt-agent.service || logger -t netopt "prolog: systemctl start failed"
  exit 0
fi
if [ -f "$PIDFILE" ] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null; then
  exit 0
fi
if ! "$NETOPT" config check --kind agent "$CONFIG" >/dev/null 2>&1; then
  logger -t netopt "prolog: $CONFIG is invalid; run: $NETOPT config check $CONFIG"
  exit 0
fi
export NETOPT_AGENT__NODE=${NETOPT_AGENT__NODE:-$(hostname -s | tr 'A-Z' 'a-z')}
setsid "$NETOPT" agent --config "$CONFIG" >>"$LOG" 2>&1 < /dev/null &
echo $! > "$PIDFILE"
exit 0
