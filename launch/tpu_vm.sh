#!/usr/bin/env bash
# Runs an rlreason experiment on a Cloud TPU VM or pod slice, from your workstation.
#
#   launch/tpu_vm.sh create  --name rl-a --zone us-west4-a --type v5litepod-16 [--spot]
#   launch/tpu_vm.sh queued  --name rl-a --zone us-west4-a --type v5litepod-64 --spot
#   launch/tpu_vm.sh setup   --name rl-a --zone us-west4-a
#   launch/tpu_vm.sh run     --name rl-a --zone us-west4-a \
#       --config experiments/grpo_gsm8k.py:qwen2.5-0.5b --workdir gs://BUCKET/runs/a -- --config.rl.steps=200
#   launch/tpu_vm.sh delete  --name rl-a --zone us-west4-a [--queued]
#
# `create` makes a TPU VM directly; `queued` asks for one through a queued resource (the way
# to get spot capacity for large slices; the VM appears when the request is granted). `setup`
# copies this checkout to every worker and runs launch/setup_tpu_vm.sh there. `run` starts
# the same `python -m rlreason.main` on every worker (`ssh --worker=all`): the processes find
# each other through the TPU metadata, so main.py needs no coordinator flags. Everything
# after `--` goes to main.py. `--dry-run` prints the gcloud commands, one per line, instead
# of running them.
set -euo pipefail

usage() { sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-2}"; }

[[ $# -ge 1 ]] || usage
case $1 in -h|--help|help) usage 0 ;; esac
action=$1; shift
name='' zone='' type='' version='' project='' config='' workdir='' spot=0 queued=0 dry_run=0
extra=()
while [[ $# -gt 0 ]]; do
  case $1 in
    --name) name=$2; shift 2 ;;
    --zone) zone=$2; shift 2 ;;
    --type) type=$2; shift 2 ;;
    --version) version=$2; shift 2 ;;
    --project) project=$2; shift 2 ;;
    --config) config=$2; shift 2 ;;
    --workdir) workdir=$2; shift 2 ;;
    --spot) spot=1; shift ;;
    --queued) queued=1; shift ;;
    --dry-run) dry_run=1; shift ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) usage 0 ;;
    *) echo "tpu_vm.sh: unknown argument '$1'" >&2; usage ;;
  esac
done
need() { for v in "$@"; do [[ -n ${!v} ]] || { echo "tpu_vm.sh $action: --$v is required" >&2; exit 2; }; done; }

# The TPU software version by chip generation, when --version is not given.
if [[ -z $version && -n $type ]]; then
  case $type in
    v6e*) version=v2-alpha-tpuv6e ;;
    v5p*) version=v2-alpha-tpuv5 ;;
    v5litepod*|v5e*) version=v2-alpha-tpuv5-lite ;;
    *) version=tpu-ubuntu2204-base ;;
  esac
fi

common=()
[[ -n $project ]] && common+=(--project "$project")

run() {  # Prints (dry run) or runs one command; printf %q keeps it a valid shell line.
  if (( dry_run )); then printf '%q ' "$@"; echo; else "$@"; fi
}

remote_dir=rlreason  # Relative to the home directory of each worker.
case $action in
  create)
    need name zone type
    flags=(--zone "$zone" --accelerator-type "$type" --version "$version" "${common[@]}")
    (( spot )) && flags+=(--spot)
    run gcloud compute tpus tpu-vm create "$name" "${flags[@]}"
    ;;
  queued)
    need name zone type
    flags=(--node-id "$name" --zone "$zone" --accelerator-type "$type"
           --runtime-version "$version" "${common[@]}")
    (( spot )) && flags+=(--spot)
    run gcloud compute tpus queued-resources create "$name-qr" "${flags[@]}"
    run gcloud compute tpus queued-resources describe "$name-qr" --zone "$zone" "${common[@]}"
    ;;
  setup)
    need name zone
    here=$(cd "$(dirname "$0")/.." && pwd)
    run gcloud compute tpus tpu-vm ssh "$name" --zone "$zone" --worker=all "${common[@]}" \
        --command "mkdir -p $remote_dir"
    run gcloud compute tpus tpu-vm scp --recurse "$here/setup.py" "$here/rlreason" \
        "$here/experiments" "$here/launch" "$name:$remote_dir" --zone "$zone" --worker=all \
        "${common[@]}"
    run gcloud compute tpus tpu-vm ssh "$name" --zone "$zone" --worker=all "${common[@]}" \
        --command "bash $remote_dir/launch/setup_tpu_vm.sh $remote_dir"
    ;;
  run)
    need name zone config workdir
    main=(cd "$remote_dir" '&&' .venv/bin/python -m rlreason.main --config "$config"
          --workdir "$workdir")
    for a in "${extra[@]+"${extra[@]}"}"; do main+=("$(printf '%q' "$a")"); done
    run gcloud compute tpus tpu-vm ssh "$name" --zone "$zone" --worker=all "${common[@]}" \
        --command "${main[*]}"
    ;;
  delete)
    need name zone
    if (( queued )); then
      run gcloud compute tpus queued-resources delete "$name-qr" --zone "$zone" --force \
          --quiet "${common[@]}"
    else
      run gcloud compute tpus tpu-vm delete "$name" --zone "$zone" --quiet "${common[@]}"
    fi
    ;;
  *) echo "tpu_vm.sh: unknown action '$action'" >&2; usage ;;
esac
