"""Where practitioners' published layouts rank when `plan` chooses for their own jobs.

Every job of the runs catalog on at least 64 GPUs (one row per job: model, accelerator,
GPUs, sequence, batch, precision, task, stack) is searched over the whole layout space
under its shipped profile and ranked as ``plan`` ranks (robust: ties within the profile's
ratio band, then the preference rules), with every rule and without rule 0; the published
degrees are then found in the ranking (``planner/runs/layout_ranks.py``). The profiles were
fitted on these runs, so this checks the ranking in-sample; the Llama 3 and DeepSeek-V3
targets (``benchmarks/published_runs.py``) are the held-out check.

Run: ``python benchmarks/published_layouts.py [--min-gpus N] [--limit N]`` (about five
minutes on 2 cores). Prints Markdown.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout, not an install


def main() -> None:
    from planner import api

    parser = argparse.ArgumentParser()
    parser.add_argument("--min-gpus", type=int, default=64)
    parser.add_argument("--limit", type=int, default=None)
    args = parser.parse_args()
    report = api.published_layout_ranks(min_gpus=args.min_gpus, limit=args.limit)
    without = {s.name: s for s in report.summaries_without_rule_0}
    print("| accelerator | jobs | published first | first without rule 0 | inside the band "
          "| median slower | 80th pct slower | published not feasible |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for s in report.summaries:
        other = without[s.name]

        def share(count: int, n: int) -> str:
            return f"{count} ({count / n:.0%})" if n else "-"

        slower = "-" if s.median_slower is None else f"{s.median_slower:.1%}"
        p80 = "-" if s.p80_slower is None else f"{s.p80_slower:.1%}"
        print(f"| {s.name} | {s.n} | {share(s.first, s.n)} | {share(other.first, other.n)} | "
              f"{share(s.equivalent, s.n)} | {slower} | {p80} | {s.not_feasible} |")  # fmt: skip
    print("\nPublished layouts the model predicts more than its band slower (slowest first):\n")
    print("| run | published tp/cp/pp/dp/ep | slower | band | winner tp/cp/pp/dp/ep |")
    print("|---|---|---|---|---|")
    outside = [r for r in report.rows if r.slower is not None and not r.equivalent_to_best]
    for r in sorted(outside, key=lambda r: -r.slower)[:15]:
        published = "/".join("-" if v is None else str(v) for v in r.published.values())
        winner = "/".join(str(v) for v in r.winner.values())
        print(f"| {r.id} | {published} | {r.slower:.1%} | {r.band:.1%} | {winner} |")


if __name__ == "__main__":
    main()
