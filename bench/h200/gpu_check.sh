#!/usr/bin/env bash
# The GPU collector on a real GPU (docs/gpu.md): llmmon serve for ~60 s while a bf16 matmul load
# alternates with idle gaps and a starved phase; a scrape and an nvidia-smi query each second,
# compared; a fresh NVML snapshot in the replay format.  Run from anywhere; needs $OUT and the
# exporter's dependencies importable (bench/h200/run_all.sh installs them from wheels).
#
#   OUT=/tmp/out bash bench/h200/gpu_check.sh            # on the GPU machine (~2 min)
#   GPU_CHECK_DRY_RUN=1 OUT=/tmp/out bash bench/h200/gpu_check.sh   # no GPU: replayed H200
#
# $OUT receives (flat): summary.txt, samples.jsonl, smi.csv, scrape_final.prom, api.json,
# load.log, serve.log, nvml_snapshot_gpu00.json.
set -u
cd "$(dirname "$0")/../.."
: "${OUT:?set OUT to the folder for results}"
mkdir -p "$OUT"
export PYTHONPATH="$PWD/exporter:$PWD/reporter:$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
WORK=$(mktemp -d)
SERVE_PID=""

cleanup() {
  if [ -n "$SERVE_PID" ] && kill -0 "$SERVE_PID" 2>/dev/null; then
    kill "$SERVE_PID" 2>/dev/null
    for _ in 1 2 3 4 5 6 7 8 9 10; do kill -0 "$SERVE_PID" 2>/dev/null || break; sleep 0.5; done
    kill -9 "$SERVE_PID" 2>/dev/null
  fi
  rm -rf "$WORK"
}
trap cleanup EXIT
step() { echo "== $(date +%T) $*"; }

if [ "${GPU_CHECK_DRY_RUN:-0}" = 1 ]; then
  SERVE_EXTRA=(--fake-nvml=tests/fixtures/nvml/h200/nvml_snapshot.json)
  SMI="sh -c 'echo 84.07, 795, 0x0000000000000001, 38, 0' nvidia-smi"
  LOAD="python3 bench/h200/matmul_load.py --dry-run"
  SNAPSHOT_EXTRA=(--fake-nvml=tests/fixtures/nvml/h200/nvml_snapshot.json)
else
  SERVE_EXTRA=()
  SMI="nvidia-smi"
  LOAD="python3 bench/h200/matmul_load.py"
  SNAPSHOT_EXTRA=()
  timeout 60 nvidia-smi -L || echo "nvidia-smi -L failed"
fi
timeout 120 python3 -c "import sys, fastapi, uvicorn, yaml, pynvml, prometheus_client
from importlib.metadata import version
print('python', sys.version.split()[0], 'nvidia-ml-py', version('nvidia-ml-py'))" || exit 1

PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
step "llmmon serve on 127.0.0.1:$PORT (gpu collector every 1 s, slow calls every 5 s)"
python3 -m llmmon serve --web.listen-address="127.0.0.1:$PORT" --collector.disable-defaults \
  --collector.gpu --collector.gpu.interval=1s --collector.gpu.slow-interval=5s \
  --collector.gpu.power-instant-latest \
  "${SERVE_EXTRA[@]}" > "$OUT/serve.log" 2>&1 &
SERVE_PID=$!

step "load ~57 s: idle, bf16 matmul, starved (0.4 s on / 0.6 s off), idle, matmul"
timeout 150 python3 bench/h200/compare.py --port "$PORT" --serve-pid "$SERVE_PID" \
  --out "$OUT" --load "$LOAD" --smi "$SMI"
rc=$?
[ $rc -eq 0 ] || { echo "compare failed ($rc); serve.log tail:"; tail -20 "$OUT/serve.log"; }

step "NVML snapshot in the replay format"
if timeout 60 python3 -m llmmon.sources.nvml_snapshot "$WORK/snapshot" "${SNAPSHOT_EXTRA[@]}"; then
  cp "$WORK/snapshot/gpu00.json" "$OUT/nvml_snapshot_gpu00.json"
fi
step "done: $(ls "$OUT" | tr '\n' ' ')"
exit $rc
