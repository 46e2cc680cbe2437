#!/usr/bin/env bash
# Train on several GPU nodes over ssh: copy this project to every host and set it up, start one trainer
# process per host (JAXRL_COORDINATOR_ADDRESS = the first host, JAXRL_NUM_PROCESSES, JAXRL_PROCESS_ID:
# jaxrl_llm/parallel/distributed.py), stream the first host's log, and restart the run from its checkpoint
# whenever it stops for preemption (exit 75). Ctrl-C / SIGTERM stop every host cleanly (each saves).
# The hosts need passwordless ssh and a shared or identical train.out_dir path (docs/scale_out.md: how a
# step runs on several processes); --dry-run shows the plan. What travels: the files git tracks (as they are
# here) and each --include PATH, never other untracked files (a stray .env); the archive is deleted on the
# host once unpacked. The config and overrides travel in that archive (tools/remote_run.sh reads them), so no
# value can change a remote command. A host whose start fails, or whose log does not appear within
# LOG_TIMEOUT_S (600) seconds, ends the launch (the hosts already started are stopped). A stop reaches each
# host's trainer by its process id (other runs on the host are left alone).
#
#   bash tools/launch_gpu_multinode.sh --hosts gpu0,gpu1 [--port 8476] [--dir jaxrl_llm] [--include PATH]... \
#        [--dry-run] -- CONFIG [a.b=value ...]
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/launch_lib.sh
hosts="" port=8476 dir="jaxrl_llm"
while [ $# -gt 0 ]; do
  case "$1" in
    --hosts) hosts=$2; shift 2 ;;
    --port) port=$2; shift 2 ;;
    --dir) dir=$2; shift 2 ;;
    --include) INCLUDE+=("$2"); shift 2 ;;
    --dry-run) DRY_RUN=1; shift ;;
    --) shift; break ;;
    *) echo "launch_gpu_multinode: unknown option $1 (see the header of $0)" >&2; exit 2 ;;
  esac
done
IFS=, read -r -a host_list <<< "$hosts"
if [ "${#host_list[@]}" -lt 1 ] || [ -z "${host_list[0]}" ]; then
  echo "launch_gpu_multinode: --hosts h1,h2,... is required (the first host coordinates)" >&2; exit 2
fi
need_config "${1:-}"
for h in "${host_list[@]}"; do plain_word "$h" "host"; done
plain_word "$dir" "--dir"
[[ "$port" =~ ^[0-9]+$ ]] || { echo "launch_gpu_multinode: --port $port is not a number" >&2; exit 2; }
[[ "$LOG_TIMEOUT_S" =~ ^[0-9]+$ ]] || { echo "launch_gpu_multinode: LOG_TIMEOUT_S=$LOG_TIMEOUT_S is not a number" >&2; exit 2; }
n=${#host_list[@]}
coordinator="${host_list[0]}:$port"

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
archive=$stage/jaxrl_llm.tar.gz
make_archive "$archive" "$@"
for h in "${host_list[@]}"; do
  run scp "$archive" "$h:~/jaxrl_llm.tar.gz"
  run ssh "$h" "$(unpack_command "$dir" cuda)"
done

at="cd ~/$dir && LOG_TIMEOUT_S=$LOG_TIMEOUT_S bash tools/remote_run.sh"
stop="$at stop"
stop_all() { local h; for h in "${host_list[@]}"; do ssh "$h" "$stop" || true; done; }
one() {
  local i=0 h rc
  for h in "${host_list[@]}"; do
    if ! run ssh "$h" "$at start JAXRL_COORDINATOR_ADDRESS=$coordinator JAXRL_NUM_PROCESSES=$n JAXRL_PROCESS_ID=$i \
XLA_PYTHON_CLIENT_MEM_FRACTION=0.92"; then
      echo "launch_gpu_multinode: starting the run on $h failed; stopping the hosts started before it" >&2
      stop_all
      return 1
    fi
    i=$((i + 1))
  done
  watch_child stop_all ssh "${host_list[0]}" "$at stream" && rc=0 || rc=$?
  if [ "$STOPPING" = 1 ] && [ "$rc" != 0 ] && [ "$rc" != "$RESUME_EXIT_CODE" ]; then
    ssh "${host_list[0]}" "$at stream" && rc=0 || rc=$?  # the stream died with the Ctrl-C: wait for the save
  fi
  return "$rc"
}
[ "$DRY_RUN" = 1 ] && echo "# on Ctrl-C / SIGTERM, on every host: + ssh HOST \"$stop\""
resume_loop one
