#!/usr/bin/env bash
# `llmmon diagnose` on a real H200: the starvation and thermal branches judged from real NVML.
# llmmon serve runs every default collector on the machine while bench/h200/matmul_load.py
# drives the GPU through a sustained bf16 matmul and a starved phase (0.4 s on / 0.6 s off);
# `llmmon diagnose --scrape --interval 8` judges the tree over an 8 s window inside each
# phase.  Expected: power_dips ok under matmul, suspect when starved.
#
#   OUT=/tmp/out bash tests/diagnose/h200/check.sh                 # on the GPU machine (~90 s)
#   DRY_RUN=1 OUT=/tmp/out bash tests/diagnose/h200/check.sh       # no GPU: replayed H200
#
# $OUT receives: summary.txt, matmul.txt/.json, starved.txt/.json, serve.log, load.log.
set -u
cd "$(dirname "$0")/../../.."
: "${OUT:?set OUT to the folder for results}"
mkdir -p "$OUT"
export PYTHONPATH="$PWD/exporter:$PWD/reporter:$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
WORK=$(mktemp -d)
PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do
    kill "$pid" 2>/dev/null
    for _ in 1 2 3 4 5 6 7 8 9 10; do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    kill -9 "$pid" 2>/dev/null
  done
  rm -rf "$WORK"
}
trap cleanup EXIT
step() { echo "== $(date +%T) $*"; }

if [ "${DRY_RUN:-0}" = 1 ]; then
  SERVE_EXTRA=(--fake-nvml=tests/fixtures/nvml/h200/nvml_snapshot.json)
  LOAD_EXTRA=(--dry-run)
else
  step "install the exporter's dependencies from .device/wheels"
  timeout 180 python3 -m pip install -q --no-index --find-links .device/wheels \
    fastapi uvicorn pyroute2 PyYAML requests prometheus_client nvidia-ml-py pydantic \
    > "$WORK/pip.log" 2>&1 || { echo "pip install failed:"; tail -20 "$WORK/pip.log"; }
  SERVE_EXTRA=()
  LOAD_EXTRA=()
  timeout 60 nvidia-smi -L || echo "nvidia-smi -L failed"
fi

PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
URL="http://127.0.0.1:$PORT"
step "llmmon serve at $URL, every default collector, gpu every 1 s"
python3 -m llmmon serve --web.listen-address="127.0.0.1:$PORT" --collector.gpu.interval=1s \
  "${SERVE_EXTRA[@]}" > "$OUT/serve.log" 2>&1 &
PIDS+=($!)
step "load: idle 8 s, matmul 15 s, starved 20 s, idle 8 s, matmul 6 s"
python3 bench/h200/matmul_load.py "$WORK/phases.jsonl" "${LOAD_EXTRA[@]}" > "$OUT/load.log" 2>&1 &
PIDS+=($!)

wait_phase() {  # until matmul_load.py logs the start of phase $1 (at most 60 s)
  for _ in $(seq 600); do
    grep -q "\"phase\": \"$1\"" "$WORK/phases.jsonl" 2>/dev/null && return 0
    sleep 0.1
  done
  echo "phase $1 never started"; return 1
}

judge() {  # `llmmon diagnose` over two scrapes 8 s apart, as JSON and as text
  python3 -m llmmon diagnose --url "$URL" --scrape --interval 8 --json > "$OUT/$1.json"
  echo "llmmon diagnose exit status $? ($1)"
  python3 -c 'import json, sys; from llmmon.diagnose import render
print(render.text(json.load(open(sys.argv[1]))))' "$OUT/$1.json" > "$OUT/$1.txt"
}

wait_phase matmul && sleep 3 && step "judge the sustained matmul" && judge matmul
wait_phase starved && sleep 3 && step "judge the starved phase" && judge starved

python3 - "$OUT" > "$OUT/summary.txt" <<'PY'
import json, sys
out = sys.argv[1]
for phase in ("matmul", "starved"):
    try:
        report = json.load(open(f"{out}/{phase}.json"))
    except OSError:
        print(f"{phase}: no report"); continue
    print(f"{phase}: verdict {report['verdict']}, suspects {report['suspects']}, "
          f"window {report['source']['window_seconds']} s")
    for branch in report["branches"]:
        for check in branch["checks"]:
            if branch["id"] in ("starvation", "thermal") or check["id"] == "gpu_errors":
                print(f"  {branch['id']}.{check['id']}: {check['verdict']}: {check['summary']}")
                for item in check["evidence"]:
                    print(f"    - {item['text']}")
PY
cat "$OUT/summary.txt"
step "done: $(ls "$OUT" | tr '\n' ' ')"
