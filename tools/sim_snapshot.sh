#!/usr/bin/env bash
# Record `tuned simulate` result.json for a fixed set of runs (seeds fixed), so that a
# behaviour-preserving change can be checked byte for byte:
#   bash tools/sim_snapshot.sh OUT_DIR [TRACE]   then   diff -r BEFORE AFTER
# TRACE defaults to the Azure conversation trace; pass the same one before and after.
# reload_token is not in these configs, so no secret lands in the files.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: tools/sim_snapshot.sh OUT_DIR [TRACE]}
trace=${2:-trace:azure_conv_2023}
py=${PYTHON:-.venv/bin/python}
mkdir -p "$out/configs"
run() {  # name, then simulate arguments
  local name=$1; shift
  echo "[snapshot] $name" >&2
  "$py" -m tuned simulate --seed 7 --out "$out/$name" "$@" >/dev/null
}
for q in fcfs mcsf multibin bucket saber sglang; do
  printf 'queue_policy = "%s"\nttft_sla_s = 2.0\n' "$q" > "$out/configs/q-$q.toml"
done
run a100-7b-phase --hardware a100-llama2-7b --workload "phase-shift:rate=12,n=200"
run h100-70b-phase --hardware h100-llama2-70b --workload "phase-shift:rate=4,n=150"
run a100-7b-azure10 --hardware a100-llama2-7b --workload "$trace,n=3300"
run a100-7b-saberW2 --hardware a100-llama2-7b --workload "saber:mix=W2,rate=12,n=300"
run cpu-phase --profile profiles/demo-small-cpu.json --workload "phase-shift:rate=1,n=40,scale=0.3"
for q in fcfs mcsf multibin bucket saber sglang; do
  run "a100-7b-$q" --hardware a100-llama2-7b --config "$out/configs/q-$q.toml" \
      --workload "saber:mix=W3,rate=14,n=300"
done
echo "[snapshot] done: $out" >&2
