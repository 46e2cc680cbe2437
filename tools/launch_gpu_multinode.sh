#!/usr/bin/env bash
# Train on several GPU nodes over ssh: copy this project to every host and set it up, start one trainer
# process per host (JAXRL_COORDINATOR_ADDRESS = the first host, JAXRL_NUM_PROCESSES, JAXRL_PROCESS_ID:
# jaxrl_llm/parallel/distributed.py), stream the first host's log, and restart the run from its checkpoint
# whenever it stops for preemption (exit 75). Ctrl-C / SIGTERM stop every host cleanly (each saves).
# The hosts need passwordless ssh and a shared or identical train.out_dir path (README, "Scale-out": how a
# step runs on several processes); --dry-run shows the plan.
#
#   bash tools/launch_gpu_multinode.sh --hosts gpu0,gpu1 [--port 8476] [--dir jaxrl_llm] [--dry-run] \
#        -- CONFIG [a.b=value ...]
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/launch_lib.sh
hosts="" port=8476 dir="jaxrl_llm"
while [ $# -gt 0 ]; do
  case "$1" in
    --hosts) hosts=$2; shift 2 ;;
    --port) port=$2; shift 2 ;;
    --dir) dir=$2; shift 2 ;;
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
n=${#host_list[@]}
coordinator="${host_list[0]}:$port"

archive=$(mktemp -d)/jaxrl_llm.tar.gz
run tar -czf "$archive" $(git ls-files -co --exclude-standard)
for h in "${host_list[@]}"; do
  run scp "$archive" "$h:~/jaxrl_llm.tar.gz"
  run ssh "$h" "mkdir -p ~/$dir && tar -xzf ~/jaxrl_llm.tar.gz -C ~/$dir && cd ~/$dir && bash tools/setup.sh cuda"
done

cmd="$(train_command "$@")"
stream="cd ~/$dir && (tail -n +1 -F train.log & t=\$!; while [ ! -f exit_code ]; do sleep 5; done; sleep 1; kill \$t); exit \$(cat exit_code)"
stop="pkill -TERM -f 'jaxrl-llm train' || true"
stop_all() { for h in "${host_list[@]}"; do ssh "$h" "$stop" || true; done; }
one() {
  local i=0 h rc
  for h in "${host_list[@]}"; do
    run ssh "$h" "cd ~/$dir && rm -f exit_code && (nohup bash -c 'JAXRL_COORDINATOR_ADDRESS=$coordinator JAXRL_NUM_PROCESSES=$n JAXRL_PROCESS_ID=$i XLA_PYTHON_CLIENT_MEM_FRACTION=0.92 $cmd > train.log 2>&1; echo \$? > exit_code' >/dev/null 2>&1 &)"
    i=$((i + 1))
  done
  [ "$DRY_RUN" != 1 ] && trap 'STOPPING=1; stop_all' INT TERM
  run ssh "${host_list[0]}" "$stream" && rc=0 || rc=$?
  trap - INT TERM
  return "$rc"
}
[ "$DRY_RUN" = 1 ] && echo "# on Ctrl-C / SIGTERM, on every host: + ssh HOST \"$stop\""
resume_loop one
