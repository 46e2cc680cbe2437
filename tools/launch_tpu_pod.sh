#!/usr/bin/env bash
# Train on a Cloud TPU VM slice: create it (--create) or reuse it, copy this project to every worker and
# set it up there, start the same training command on all workers, stream worker 0's log, and restart
# the run from its checkpoint whenever it stops for preemption or maintenance (exit 75). Ctrl-C / SIGTERM
# stop every worker cleanly (each saves), then the script exits; run it again to resume.
# What travels, how arguments reach the workers, start failures, the log timeout (LOG_TIMEOUT_S) and stops by
# process id: as in tools/launch_gpu_multinode.sh. Needs the gcloud CLI, logged in. Multi-worker slices (e.g.
# v5p-64) run one process per worker (JAXRL_DISTRIBUTED=auto, docs/scale_out.md); the multi-host path is
# tested on CPU processes only, and this script has not run against a real slice.
#
#   bash tools/launch_tpu_pod.sh --name NAME --zone ZONE --type v5litepod-8 [--version tpu-ubuntu2204-base]
#        [--project PROJECT] [--create] [--spot] [--dir jaxrl_llm] [--include PATH]... [--dry-run] \
#        -- CONFIG [a.b=value ...]
#   bash tools/launch_tpu_pod.sh --dry-run --name rl --zone us-west4-a --type v5litepod-8 --create -- configs/tpu_qwen2.5_1.5b.yaml
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/launch_lib.sh
name="" zone="" type="" version="tpu-ubuntu2204-base" project="" create=0 spot=0 dir="jaxrl_llm"
while [ $# -gt 0 ]; do
  case "$1" in
    --name) name=$2; shift 2 ;;
    --zone) zone=$2; shift 2 ;;
    --type) type=$2; shift 2 ;;
    --version) version=$2; shift 2 ;;
    --project) project=$2; shift 2 ;;
    --dir) dir=$2; shift 2 ;;
    --include) INCLUDE+=("$2"); shift 2 ;;
    --create) create=1; shift ;;
    --spot) spot=1; shift ;;
    --dry-run) DRY_RUN=1; shift ;;
    --) shift; break ;;
    *) echo "launch_tpu_pod: unknown option $1 (see the header of $0)" >&2; exit 2 ;;
  esac
done
for v in name zone; do
  if [ -z "${!v}" ]; then echo "launch_tpu_pod: --$v is required" >&2; exit 2; fi
done
need_config "${1:-}"
plain_word "$dir" "--dir"
[[ "$LOG_TIMEOUT_S" =~ ^[0-9]+$ ]] || { echo "launch_tpu_pod: LOG_TIMEOUT_S=$LOG_TIMEOUT_S is not a number" >&2; exit 2; }
gc=(gcloud compute tpus tpu-vm)
where=(--zone="$zone")
[ -n "$project" ] && where+=(--project="$project")

# 1. the slice: reuse it, or create it
if [ "$DRY_RUN" = 1 ] || ! "${gc[@]}" describe "$name" "${where[@]}" >/dev/null 2>&1; then
  if [ "$create" = 1 ]; then
    if [ -z "$type" ]; then echo "launch_tpu_pod: --create needs --type (e.g. v5litepod-8)" >&2; exit 2; fi
    extra=(); [ "$spot" = 1 ] && extra=(--spot)
    run "${gc[@]}" create "$name" "${where[@]}" --accelerator-type="$type" --version="$version" \
      ${extra[@]+"${extra[@]}"}
  elif [ "$DRY_RUN" != 1 ]; then
    echo "launch_tpu_pod: no TPU VM $name in $zone; pass --create --type TYPE to make one" >&2; exit 2
  fi
fi

# 2. the project on every worker: the files git tracks, each --include PATH and the run's arguments
#    (.launch_args, read by tools/remote_run.sh there), set up with TPU jax; the archive is deleted once unpacked
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
archive=$stage/jaxrl_llm.tar.gz
make_archive "$archive" "$@"
run "${gc[@]}" scp "$archive" "$name:~/jaxrl_llm.tar.gz" "${where[@]}" --worker=all
run "${gc[@]}" ssh "$name" "${where[@]}" --worker=all --command="$(unpack_command "$dir" tpu)"

# 3. the run on all workers (JAXRL_DISTRIBUTED=auto: jax.distributed finds the slice's workers itself),
#    each logging to ~/DIR/.run/HOST/train.log and leaving its exit status in ~/DIR/.run/HOST/exit_code;
#    worker 0 streamed
at="cd ~/$dir && LOG_TIMEOUT_S=$LOG_TIMEOUT_S bash tools/remote_run.sh"
stop_all() { "${gc[@]}" ssh "$name" "${where[@]}" --worker=all --command="$at stop" || true; }
one() {
  local rc
  if ! run "${gc[@]}" ssh "$name" "${where[@]}" --worker=all --command="$at start JAXRL_DISTRIBUTED=auto"; then
    echo "launch_tpu_pod: starting the run failed on a worker; stopping the workers that started" >&2
    stop_all
    return 1
  fi
  watch_child stop_all "${gc[@]}" ssh "$name" "${where[@]}" --worker=0 --command="$at stream" && rc=0 || rc=$?
  if [ "$STOPPING" = 1 ] && [ "$rc" != 0 ] && [ "$rc" != "$RESUME_EXIT_CODE" ]; then
    "${gc[@]}" ssh "$name" "${where[@]}" --worker=0 --command="$at stream" && rc=0 || rc=$?  # stream died with Ctrl-C
  fi
  return "$rc"
}
[ "$DRY_RUN" = 1 ] && echo "# on Ctrl-C / SIGTERM: + ${gc[*]} ssh $name ${where[*]} --worker=all --command=\"$at stop\""
resume_loop one
