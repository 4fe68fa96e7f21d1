"""A bf16 matmul load that alternates with idle gaps, for the H200 check of the GPU collector.

Phases (seconds): idle 8, matmul 15 (sustained, at the power cap), starved 20 (0.4 s of
compute then 0.6 s idle, the data-loader starvation pattern: ~20 dips), idle 8, matmul 6.
Each phase start is appended to PHASES as a JSON line {"phase", "t"} (wall clock), and the
achieved TFLOP/s of the sustained phase is printed.  --dry-run sleeps through the same
schedule without CUDA, to test the check without a GPU.
"""

from __future__ import annotations

import argparse
import json
import time

SCHEDULE = (("idle", 8.0), ("matmul", 15.0), ("starved", 20.0), ("idle_after", 8.0),
            ("matmul_again", 6.0))
N = 8192
STARVED_ON_S, STARVED_OFF_S = 0.4, 0.6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("phases", help="JSON-lines file the phase starts are appended to")
    parser.add_argument("--dry-run", action="store_true")
    args = parser.parse_args()

    compute = None
    if not args.dry_run:
        import torch

        print(json.dumps({"torch": torch.__version__, "device": torch.cuda.get_device_name()}),
              flush=True)
        a = torch.randn(N, N, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(N, N, device="cuda", dtype=torch.bfloat16)
        c = a @ b
        torch.cuda.synchronize()

        def compute(seconds: float) -> float:
            """Matmuls for `seconds`; returns TFLOP/s achieved."""
            done, started = 0, time.perf_counter()
            while time.perf_counter() - started < seconds:
                for _ in range(16):
                    torch.matmul(a, b, out=c)
                torch.cuda.synchronize()
                done += 16
            return done * 2 * N ** 3 / (time.perf_counter() - started) / 1e12

    with open(args.phases, "a", encoding="utf-8") as log:
        for phase, seconds in SCHEDULE:
            log.write(json.dumps({"phase": phase, "t": time.time()}) + "\n")
            log.flush()
            end = time.monotonic() + seconds
            if compute is None or phase.startswith("idle"):
                time.sleep(seconds)
            elif phase == "starved":
                while time.monotonic() < end:
                    compute(STARVED_ON_S)
                    time.sleep(STARVED_OFF_S)
            else:
                tflops = compute(seconds)
                print(json.dumps({"phase": phase, "bf16_tflops": round(tflops, 1)}), flush=True)
        log.write(json.dumps({"phase": "end", "t": time.time()}) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
