#!/usr/bin/env bash
# Prepares one TPU VM worker (tpu_vm.sh setup runs it on every worker): a venv with
# `pip install .[tpu,gcs]` (gcs: a gs:// workdir). Idempotent: a second run with the same
# setup.py does nothing.
#
#   bash launch/setup_tpu_vm.sh [CHECKOUT_DIR] [--dry-run]
#
# `--dry-run` prints the commands it would run, one per line.
set -euo pipefail
dir='' dry_run=0
for a in "$@"; do
  case $a in
    --dry-run) dry_run=1 ;;
    -*) echo "setup_tpu_vm.sh: unknown flag '$a'" >&2; exit 2 ;;
    *) dir=$a ;;
  esac
done
dir=${dir:-$(cd "$(dirname "$0")/.." && pwd)}
run() { if (( dry_run )); then printf '%q ' "$@"; echo; else "$@"; fi; }

venv="$dir/.venv"
stamp="$venv/.rlreason-setup"
want=$(sha256sum "$dir/setup.py" | cut -d' ' -f1)
if [[ -f $stamp && $(cat "$stamp") == "$want" ]] && (( ! dry_run )); then
  echo "setup_tpu_vm.sh: $venv is up to date with setup.py"; exit 0
fi
[[ -x $venv/bin/python ]] || run python3 -m venv "$venv"
run "$venv/bin/pip" install --upgrade pip
run "$venv/bin/pip" install "$dir[tpu,gcs]"
run "$venv/bin/python" -c 'import jax; print(jax.process_index(), jax.device_count(), jax.devices()[0].device_kind)'
if (( dry_run )); then printf '%q ' sh -c "echo $want > $stamp"; echo; else echo "$want" > "$stamp"; fi
