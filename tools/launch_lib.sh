# Shared by tools/launch_*.sh (sourced, not run): dry-run aware command runner, the resume loop, and the
# training command line. A launch script sets DRY_RUN=1 on --dry-run: every command that would touch a
# machine is printed (one line each, prefixed "+ ") instead of run.

RESUME_EXIT_CODE=75  # jaxrl_llm/train/loop.py: stopped by SIGTERM / preemption after saving; run again to resume
DRY_RUN=${DRY_RUN:-0}
MAX_RESTARTS=${MAX_RESTARTS:-100}

run() {  # run "$@", or print it under --dry-run
  if [ "$DRY_RUN" = 1 ]; then
    printf '+'; printf ' %q' "$@"; printf '\n'
  else
    "$@"
  fi
}

train_command() {  # the trainer's command line for CONFIG [a.b=value ...], shell-quoted, for a remote shell
  local out="env HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 .venv/bin/jaxrl-llm train --config"
  local arg
  for arg in "$@"; do out+=" $(printf '%q' "$arg")"; done
  printf '%s' "$out"
}

resume_loop() {  # resume_loop FUNCTION: call it until it exits with something other than RESUME_EXIT_CODE
  local rc restarts=0
  while :; do
    "$1" && rc=0 || rc=$?
    if [ "$DRY_RUN" = 1 ] || [ "$rc" != "$RESUME_EXIT_CODE" ] || [ "$STOPPING" = 1 ]; then
      return "$rc"  # finished, failed, or stopped by the user (the run saved: rerun the script to resume)
    fi
    restarts=$((restarts + 1))
    if [ "$restarts" -gt "$MAX_RESTARTS" ]; then
      echo "launch: stopped after $MAX_RESTARTS restarts" >&2
      return "$rc"
    fi
    echo "launch: the run was preempted (exit $rc); restart $restarts resumes it from its checkpoint" >&2
  done
}

need_config() {  # need_config CONFIG: the config must exist here (it is copied with the project)
  if [ -z "${1:-}" ]; then echo "launch: give the run config after --, e.g. -- configs/tpu_v5e_8.yaml" >&2; exit 2; fi
  if [ ! -f "$1" ]; then echo "launch: no config file $1" >&2; exit 2; fi
}

STOPPING=0
run_child() {  # run "$@" as a child; SIGINT / SIGTERM to this script reach it as SIGTERM (it saves and exits)
  if [ "$DRY_RUN" = 1 ]; then run "$@"; return 0; fi
  "$@" &
  local child=$! rc
  trap 'STOPPING=1; kill -TERM '"$child"' 2>/dev/null || true' INT TERM
  while :; do
    wait "$child" && rc=0 || rc=$?
    kill -0 "$child" 2>/dev/null || break  # wait returned for a trapped signal while the child still runs
  done
  trap - INT TERM
  return "$rc"
}
