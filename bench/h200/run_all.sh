#!/usr/bin/env bash
# Every H200 check in one prepared run, for a device lease (~7 min; each check's own docstring
# says what it does), most wanted first:
#   1. bench/h200/faults_check.py: the fault benchmark's one-GPU variant;
#   2. bench/trainer_jitter.py --loops bf16: the reporter's main-thread stall per tick kind in a
#      bf16 training loop with NCCL, stack capture included;
#   3. bench/h200/reporter_check.py: the reporter's numbers against NCCL's and the allocator's;
#   4. bench/h200/gpu_check.sh: the NVML collector against nvidia-smi under a bf16 load.
# The exporter's dependencies travel as wheels in .whl (CONTRIBUTING.md says how to fetch them).
# The results are packed into $OUT/h200.tgz after every check (a run cut short keeps what it
# measured), with the logs' tails on stdout.
#
#   OUT=/tmp/out bash bench/h200/run_all.sh             # every check
#   OUT=/tmp/out CHECKS="1 3" bash bench/h200/run_all.sh  # only these (a short lease)
set -u
cd "$(dirname "$0")/../.."
: "${OUT:?set OUT to the folder for results}"
RESULTS=$(mktemp -d)
CHECKS=${CHECKS:-1 2 3 4}
step() { echo "== $(date +%T) $*"; }
wanted() { [[ " $CHECKS " == *" $1 "* ]]; }
pack() { tar czf "$OUT/h200.tgz" -C "$RESULTS" .; }

step "the exporter's dependencies from .whl into /tmp/site"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl > "$RESULTS/pip.log" 2>&1 || tail -5 "$RESULTS/pip.log"
export PYTHONPATH="$PWD/exporter:$PWD/reporter:$PWD:/tmp/site" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv
python3 -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name(0),
'nccl', torch.cuda.nccl.version())" 2>&1 | tail -1

if wanted 1; then
  step "1. fault benchmark, one-GPU variant (window 75 s)"
  timeout 240 python3 -m bench.h200.faults_check "$RESULTS/faults" --window 75 \
    > "$RESULTS/faults.log" 2>&1
  echo "rc=$?"; grep -v "Warning\|^\*\*\|^- \|^$" "$RESULTS/faults.log" | tail -12
  pack
fi

if wanted 2; then
  step "2. trainer jitter, bf16 + NCCL loop (20 s of each block kind, a ring tick a second)"
  timeout 130 python3 bench/trainer_jitter.py --loops bf16 --seconds 20 --block 5 \
    --entries-interval 1 > "$RESULTS/jitter.log" 2>&1
  echo "rc=$?"; grep -v Warning "$RESULTS/jitter.log" | tail -14
  cp bench/results/trainer_jitter.json "$RESULTS/" 2>/dev/null
  pack
fi

if wanted 3; then
  step "3. reporter against NCCL and the allocator"
  timeout 120 python3 bench/h200/reporter_check.py "$RESULTS/reporter" \
    > "$RESULTS/reporter.log" 2>&1
  echo "rc=$?"; grep -v Warning "$RESULTS/reporter.log" | tail -c 1500
  pack
fi

if wanted 4; then
  step "4. NVML collector against nvidia-smi"
  OUT="$RESULTS/gpu" timeout 100 bash bench/h200/gpu_check.sh > "$RESULTS/gpu_check.log" 2>&1
  echo "rc=$?"; tail -16 "$RESULTS/gpu_check.log"
  pack
fi
step done
