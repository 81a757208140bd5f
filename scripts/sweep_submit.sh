#!/usr/bin/env bash
# Submit a kfray sweep to a running Ray cluster as a Ray job.
#
#   scripts/sweep_submit.sh [--address http://HEAD:8265] [--no-wait] SUITE_OR_DIR [kfray sweep options...]
#
# e.g. scripts/sweep_submit.sh --address http://head:8265 llama32-1b --config configs/cuda.yaml \
#          --set proposer.kind=llm --budget-total 600
#
# The repository is shipped as the job's working directory, so task folders given as paths must lie
# inside it (they travel with it; the job sees them at the same relative path). Suites shipped in
# kfray/suites need nothing. The job's driver joins the cluster (--address auto) and its results
# land in runs/<timestamp> on the head node; `ray job logs JOB_ID` shows the table.
set -euo pipefail

ADDRESS="${RAY_ADDRESS:-http://127.0.0.1:8265}"
WAIT=1
while [[ $# -gt 0 ]]; do
  case "$1" in
    --address) ADDRESS="$2"; shift 2 ;;
    --no-wait) WAIT=0; shift ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) break ;;
  esac
done
if [[ $# -lt 1 ]]; then
  echo "usage: $0 [--address URL] [--no-wait] SUITE_OR_DIR [kfray sweep options...]" >&2
  exit 2
fi
command -v ray >/dev/null || { echo "$0: the ray CLI is not on PATH (pip install 'ray[default]')" >&2; exit 2; }

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
ENTRY=(python -m kfray.sweep "$@" --address auto)
if command -v kfray >/dev/null && kfray sweep --help >/dev/null 2>&1; then
  ENTRY=(kfray sweep "$@" --address auto)
fi
EXTRA=()
[[ $WAIT -eq 0 ]] && EXTRA+=(--no-wait)

exec ray job submit --address "$ADDRESS" --working-dir "$ROOT" \
  --runtime-env-json '{"excludes": [".git", "runs", "*.db", ".gpubundle"], "env_vars": {"PYTHONPATH": "."}}' \
  "${EXTRA[@]}" -- "${ENTRY[@]}"
