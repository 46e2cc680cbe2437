#!/usr/bin/env bash
# The multi-host launch scripts' (tools/launch_gpu_multinode.sh, tools/launch_tpu_pod.sh) agent on each host,
# run from the project's folder there. The run's config and overrides arrive in the file .launch_args (NUL
# separated, shipped in the project archive), never in a remote command line, so no value can change what
# the remote shell runs.
#
#   bash tools/remote_run.sh start [NAME=VALUE ...]   start the trainer in the background with these variables;
#                                                     fails unless its log train.log appears in LOG_TIMEOUT_S
#   bash tools/remote_run.sh stream [LOG_TIMEOUT_S]   print train.log until the run ends; exit with its status
#   bash tools/remote_run.sh stop                     SIGTERM to this run's trainer (by process id): it saves
#                                                     and exits 75
# Files in .run/HOST/ beside the project (HOST: this machine's hostname, or JAXRL_HOST_ID): train.log, exit_code
# (the trainer's exit status), run.pid (the trainer's process id), wrap.pid (the process that waits for it and writes
# exit_code). One folder per host: hosts that share a home (NFS) would otherwise delete and overwrite each other's.
set -euo pipefail
LOG_TIMEOUT_S=${LOG_TIMEOUT_S:-600}
host=${JAXRL_HOST_ID:-$(hostname)}
[[ "$host" =~ ^[A-Za-z0-9_.-]+$ ]] || { echo "remote_run: bad host name $host" >&2; exit 2; }
state=.run/$host
mkdir -p "$state"
LOG=$state/train.log CODE=$state/exit_code RUN_PID=$state/run.pid WRAP_PID=$state/wrap.pid

alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

# the agent polls for the log and the exit status every POLL_S (a file test: nothing next to a run), so a launch
# learns of either within a fifth of a second, not a second
POLL_S=0.2

wait_for_log() {  # wait_for_log SECONDS: true once the log exists
  local until=$((SECONDS + $1))
  while [ ! -f "$LOG" ]; do
    if [ "$SECONDS" -gt "$until" ]; then return 1; fi  # -gt: never before $1 whole seconds
    sleep "$POLL_S"
  done
}

case "${1:-}" in
  start)
    shift
    for kv in "$@"; do
      [[ "$kv" =~ ^[A-Z_][A-Z0-9_]*=[A-Za-z0-9_.:@-]*$ ]] || { echo "remote_run: bad variable $kv" >&2; exit 2; }
    done
    [ -f .launch_args ] || { echo "remote_run: no .launch_args in $PWD (copy the project again)" >&2; exit 2; }
    if alive "$RUN_PID"; then
      echo "remote_run: a run is still going in $PWD (process $(cat "$RUN_PID"))" >&2; exit 2
    fi
    rm -f "$CODE" "$RUN_PID" "$WRAP_PID" "$LOG"
    nohup bash tools/remote_run.sh wrap "$@" >/dev/null 2>&1 &
    if ! wait_for_log "$LOG_TIMEOUT_S"; then
      echo "remote_run: the run's log $PWD/$LOG did not appear within ${LOG_TIMEOUT_S} s" >&2; exit 3
    fi
    ;;
  wrap)  # the trainer's parent: records its process id and, once it ends, its exit status
    shift
    echo $$ > "$WRAP_PID"
    mapfile -d '' args < .launch_args
    env "$@" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 \
      .venv/bin/jaxrl-llm train --config "${args[@]}" > "$LOG" 2>&1 &
    echo $! > "$RUN_PID"
    wait $! && rc=0 || rc=$?
    echo "$rc" > "$CODE"
    ;;
  stream)
    timeout=${2:-$LOG_TIMEOUT_S}
    if ! wait_for_log "$timeout"; then
      echo "remote_run: the run's log $PWD/$LOG did not appear within $timeout s" >&2; exit 3
    fi
    tail -s "$POLL_S" -n +1 -F "$LOG" 2>/dev/null &
    t=$!
    trap 'kill $t 2>/dev/null || true' EXIT
    while [ ! -f "$CODE" ]; do
      if ! alive "$WRAP_PID" && [ ! -f "$CODE" ]; then
        echo "remote_run: the run in $PWD ended without an exit status (its wrapper was killed)" >&2; exit 3
      fi
      sleep "$POLL_S"
    done
    sleep 0.6  # three of tail's polls: the log's last lines are out before the status
    exit "$(cat "$CODE")"
    ;;
  stop)
    if alive "$RUN_PID"; then kill -TERM "$(cat "$RUN_PID")"; else echo "remote_run: no run going in $PWD" >&2; fi
    ;;
  *) echo "remote_run: start | stream | stop (see the header of $0)" >&2; exit 2 ;;
esac
