"""The whole runs catalog through `runs check` and `fit`: where the model stands, measured.

1. Every row of ``hwspecs/data/runs/train.json`` and ``targets.json`` predicted with its
   published layout pinned, by the ideal model (``--profile none``) and with the shipped
   profiles: n, MAPE, median signed error and the share within ±20%, per accelerator.
2. Each shipped profile (per accelerator, and per accelerator and stack) refitted from the
   train catalog: in-sample, k-fold by source family (by configuration group where one
   family is all there is) and leave-one-source-out MAPE, with the worst family.
3. The test targets (never fitted on): Llama 3 405B Table 4 (MFU, BF16 peak) and
   DeepSeek-V3 (causal MFU and tokens/s per GPU), published vs predicted.

Run: ``python benchmarks/runs_check.py`` (about half a minute on 2 cores). Prints Markdown.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout, not an install

from hwspecs.catalog import load_profile, profile_names
from planner import api


def stats_line(name: str, s) -> str:
    return (f"| {name} | {s.n} | {s.mape:.1%} | {s.median_signed_error:+.1%} | "
            f"{s.within_20pct:.0%} |")  # fmt: skip


def main() -> None:
    checks = {label: api.runs_check(profile=choice) for label, choice in
              (("ideal", "none"), ("shipped profiles, in-sample on train rows", None))}  # fmt: skip
    print("#### Published runs: predicted vs measured tokens/s per GPU\n")
    for label, result in checks.items():
        print(f"#### {label} ({result.num_covered} of {result.num_rows} rows covered)\n")
        print("| accelerator | n | MAPE | median | ±20% |\n|---|---|---|---|---|")
        print(stats_line("all", result.overall))
        for s in result.by_accelerator:
            print(stats_line(s.name, s))
        print()
    print("Not covered:", ", ".join(f"{k} ({v})" for k, v in checks["ideal"].uncovered.items()))
    print("\n#### Profiles refitted on the train catalog\n")
    print("| profile | rows | ideal | in-sample | k-fold | LOSO | worst source (LOSO) |")
    print("|---|---|---|---|---|---|---|")
    for name in profile_names():
        profile = load_profile(name)
        f = api.fit(None, profile.accelerator, profile.stack).fit

        def pct(value):
            return "-" if value is None else f"{value:.1%}"

        by = f["loso_mape_by_source"]
        worst = max(by, key=by.get) if by else "-"
        worst_text = f"{worst} {by[worst]:.1%}" if by else "-"
        print(f"| {name} | {f['num_rows']} | {pct(f['ideal_mape'])} | "
              f"{pct(f['in_sample_mape'])} | {pct(f['kfold_mape'])} | {pct(f['loso_mape'])} | "
              f"{worst_text} |")  # fmt: skip
    print("\n#### Test targets (never fitted on)\n")
    print("| run | published MFU | ideal MFU | profile MFU | published tok/s | ideal | profile |")
    print("|---|---|---|---|---|---|---|")
    ideal = {r.id: r for r in checks["ideal"].rows}
    for row in checks["shipped profiles, in-sample on train rows"].rows:
        if not row.id.startswith(("llama3-405b-table4", "deepseek-v3-pretrain")):
            continue
        base = ideal[row.id]
        causal = row.id.startswith("deepseek")
        key = "predicted_mfu_causal" if causal else "predicted_mfu"
        label = " (causal)" if causal else ""
        print(f"| {row.id} | {row.published_mfu:.1%}{label} | {getattr(base, key):.1%} | "
              f"{getattr(row, key):.1%} | {row.measured_tokens_per_s_per_gpu:,.0f} | "
              f"{base.predicted_tokens_per_s_per_gpu:,.0f} | "
              f"{row.predicted_tokens_per_s_per_gpu:,.0f} |")  # fmt: skip


if __name__ == "__main__":
    main()
