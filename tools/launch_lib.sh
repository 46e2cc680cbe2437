# Shared by tools/launch_*.sh (sourced, not run): dry-run aware command runner, the resume loop, signals that
# reach the run while its log streams, and what a multi-host launch ships and runs on each host. A launch
# script sets DRY_RUN=1 on --dry-run: every command that would touch a machine is printed (one line each,
# prefixed "+ ") instead of run.

RESUME_EXIT_CODE=75  # jaxrl_llm/train/stop.py: stopped by SIGTERM / preemption after saving; run again to resume
DRY_RUN=${DRY_RUN:-0}
MAX_RESTARTS=${MAX_RESTARTS:-100}

run() {  # run "$@", or print it under --dry-run
  if [ "$DRY_RUN" = 1 ]; then
    printf '+'; printf ' %q' "$@"; printf '\n'
  else
    "$@"
  fi
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
  if [ -z "${1:-}" ]; then echo "launch: give the run config after --, e.g. -- configs/tpu_qwen2.5_1.5b.yaml" >&2; exit 2; fi
  if [ ! -f "$1" ]; then echo "launch: no config file $1" >&2; exit 2; fi
}

STOPPING=0
CHILD=""
run_child() {  # run "$@" as a child; SIGINT / SIGTERM to this script reach it as SIGTERM (it saves and exits)
  watch_child term_child "$@"
}
term_child() { kill -TERM "$CHILD" 2>/dev/null || true; }

watch_child() {  # watch_child ON_STOP CMD...: run CMD as a child; on SIGINT / SIGTERM call ON_STOP and keep waiting
  # (a foreground command would defer the trap until it ends: a streamed log never ends by itself)
  local on_stop=$1 rc
  shift
  if [ "$DRY_RUN" = 1 ]; then run "$@"; return 0; fi
  "$@" &
  CHILD=$!
  trap 'STOPPING=1; '"$on_stop" INT TERM
  while :; do
    wait "$CHILD" && rc=0 || rc=$?
    kill -0 "$CHILD" 2>/dev/null || break  # wait returned for a trapped signal while the child still runs
  done
  trap - INT TERM
  return "$rc"
}

# -- multi-host launches: what travels to the hosts, and the commands they run (tools/remote_run.sh there) --
LOG_TIMEOUT_S=${LOG_TIMEOUT_S:-600}  # a run whose log has not appeared by then failed to start
INCLUDE=()  # --include PATH: untracked files to ship as well (a local model folder, a data file)

plain_word() {  # plain_word VALUE WHAT: VALUE goes into a remote command line, so only plain characters
  if ! [[ "$1" =~ ^[A-Za-z0-9_@.][A-Za-z0-9_@./:-]*$ ]]; then
    echo "launch: $2 '$1' may hold only letters, digits and _@.:/- (it becomes part of a remote command)" >&2; exit 2
  fi
}

make_archive() {  # make_archive ARCHIVE CONFIG [a.b=value ...]: the tracked files as they are here, the --include
  # paths, and .launch_args (the run's arguments, NUL separated: no value is ever part of a remote command)
  local archive=$1 stage p
  shift
  stage=$(dirname "$archive")
  for p in ${INCLUDE[@]+"${INCLUDE[@]}"}; do  # (the guard: bash < 4.4 calls an empty array unbound under set -u)
    if [[ "$p" = /* || "/$p/" = */../* ]]; then
      echo "launch: --include $p must be a path inside the project" >&2; exit 2
    fi
    if [ ! -e "$p" ]; then echo "launch: --include $p: no such file or folder" >&2; exit 2; fi
  done
  printf '%s\0' "$@" > "$stage/.launch_args"
  # what travels: tracked files, the --include paths, tools/remote_run.sh (the hosts' agent, even untracked)
  { git ls-files -z | while IFS= read -r -d '' p; do if [ -e "$p" ]; then printf '%s\0' "$p"; fi; done
    for p in ${INCLUDE[@]+"${INCLUDE[@]}"} tools/remote_run.sh; do printf '%s\0' "$p"; done
    [[ "$1" = /* || "/$1/" = */../* ]] || printf '%s\0' "$1"; } > "$stage/files"  # the config, tracked or not
  run tar -czf "$archive" --null -T "$stage/files" -C "$stage" .launch_args
  if [ "$DRY_RUN" = 1 ]; then
    printf '# %s files; on each host the run is: jaxrl-llm train --config' "$(tr -cd '\0' < "$stage/files" | wc -c)"
    printf ' %q' "$@"; printf '\n'
  fi
}

unpack_command() {  # unpack_command DIR SETUP_ARG: unpack the archive into ~/DIR, delete it, set up
  printf '%s' "mkdir -p ~/$1 && tar -xzf ~/jaxrl_llm.tar.gz -C ~/$1 && rm -f ~/jaxrl_llm.tar.gz && cd ~/$1 && "
  printf '%s' "bash tools/setup.sh $2"
}
