"""How fast the schedule generators and the event simulator run, in actions per second.

Times every schedule at pp = 64, 512 micro-batches (vpp 4 for interleaved 1F1B, 2 for the
V schedules), the size the issue asks to simulate in seconds, and prints one line each.

    python benchmarks/schedule_speed.py [--pp 64] [--microbatches 512] [--vpp 4]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from planner.pipeline.schedules import SCHEDULES, generate_schedule
from planner.pipeline.simulate import simulate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pp", type=int, default=64)
    parser.add_argument("--microbatches", type=int, default=512)
    parser.add_argument("--vpp", type=int, default=4, help="chunks per rank for interleaved-1f1b")
    args = parser.parse_args()
    print(f"pp={args.pp} microbatches={args.microbatches}")
    print(
        f"{'schedule':18} {'vpp':>3} {'actions':>9} {'generate s':>10} {'simulate s':>10} {'actions/s':>11}"
    )
    for name, spec in SCHEDULES.items():
        vpp = args.vpp if spec.fixed_vpp is None else spec.fixed_vpp
        chunks = 1 if spec.bidirectional else vpp
        t0 = time.perf_counter()
        actions = generate_schedule(name, args.pp, args.microbatches, vpp)
        t1 = time.perf_counter()
        share = 1.0 / chunks
        simulate(actions, share, share, share, activation_share=share)
        t2 = time.perf_counter()
        count = sum(len(ops) for ops in actions)
        print(
            f"{name:18} {vpp:>3} {count:>9} {t1 - t0:>10.2f} {t2 - t1:>10.2f} {count / (t2 - t1):>11,.0f}"
        )


if __name__ == "__main__":
    main()
