"""Build the project's runs catalog (hwspecs/data/runs/) from the shared reference rows.

Reads ``shared/reference/runs/train.json`` (published runs with their sources) and writes
``hwspecs/data/runs/train.json`` in the schema of :mod:`hwspecs.runs`: the facts and their
``source_ref`` as transcribed, the reference's reading notes replaced by a short note of
our own saying which values were derived or assumed, MLA ranks moved from the free-text
architecture note into ``model.mla``, and the settings ``supplements.json`` names filled in
(each a field the row's table left empty that the same release's launch script sets, kept
on the row with its file and lines: ``RunRow.supplements``). The test targets (``targets.json``) are not copied:
the project ships no target row, and the build refuses a train row that is a target.

Run from the repository root::

    PYTHONPATH=. python scripts/build_runs_catalog.py [--reference ../shared/reference/runs]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from hwspecs.runs import RunRow, RunSupplement, mla_ranks, node_limit

OUT_DIR = Path(__file__).resolve().parents[1] / "hwspecs" / "data" / "runs"
SUPPLEMENTS = OUT_DIR / "supplements.json"


def our_note(row: dict) -> str:
    """A note in the project's words: where the row comes from and what was not printed."""
    ref = row["source_ref"]
    where = ref.get("table") or ref.get("path") or ref.get("url") or ref.get("arxiv") or ""
    parts = [f"From {ref['kind']} {ref.get('repo') or ref.get('arxiv') or ''} ({where})."]
    if row["derived_fields"]:
        parts.append(
            "Computed from other printed values: " + ", ".join(row["derived_fields"]) + "."
        )
    if row["inferred_fields"]:
        parts.append("Assumed, not printed: " + ", ".join(row["inferred_fields"]) + ".")
    for supplement in row.get("supplements", []):
        ref = supplement["source_ref"]
        where = (
            f"{supplement['release']}'s recipe" if supplement.get("release") else "the same commit"
        )
        parts.append(f"Not in the table, set by {ref['path']} at {where}: {supplement['field']}.")
    if row["group"]:
        parts.append(f"Configuration group {row['group']}.")
    return " ".join(part for part in parts if part)


def supplemented(row: dict, supplements: list[dict]) -> dict:
    """The row with the launch-script settings that name it filled in. A supplement fills
    only a field the row leaves empty, from a file at the row's own source commit."""
    out = json.loads(json.dumps(row))
    for entry in supplements:
        if row["id"] not in entry["ids"]:
            continue
        same_commit = entry["source_ref"]["commit"] == row["source_ref"].get("commit")
        same_release = entry.get("release") == row["training"].get("framework_version")
        if not (same_commit or (entry.get("release") and same_release)):
            raise SystemExit(f"{row['id']}: supplement {entry['field']} is from another commit")
        section, key = entry["field"].split(".")
        if out[section].get(key) is not None:
            raise SystemExit(f"{row['id']}: {entry['field']} is published; not overwritten")
        out[section][key] = entry["value"]
        names = ("field", "value", "source_ref", "quote", "release")
        record = {name: entry[name] for name in names if name in entry}
        out.setdefault("supplements", []).append(RunSupplement.model_validate(record).model_dump())
    return out


def converted(row: dict, cluster: str | None, supplements: list[dict] = ()) -> dict:
    """One reference row in the catalog's schema (validated)."""
    out = supplemented(row, list(supplements))
    out["notes"] = our_note(out)
    out["model"]["mla"] = mla_ranks(row["model"].get("arch_notes"))
    if out["model"].get("moe"):
        out["model"]["moe"]["max_nodes_per_token"] = node_limit(out["model"]["moe"].get("notes"))
    out["hardware"]["cluster"] = cluster
    return RunRow.model_validate(out).model_dump(mode="json")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default = Path(__file__).resolve().parents[2] / "shared" / "reference" / "runs"
    parser.add_argument("--reference", type=Path, default=default)
    args = parser.parse_args()
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    targets = {row["id"] for row in json.loads((args.reference / "targets.json").read_text())}
    rows = json.loads((args.reference / "train.json").read_text())
    overlap = targets & {row["id"] for row in rows}
    if overlap:
        raise SystemExit(f"train rows that are test targets: {sorted(overlap)}")
    supplements = json.loads(SUPPLEMENTS.read_text())
    unknown = {i for entry in supplements for i in entry["ids"]} - {row["id"] for row in rows}
    if unknown:
        raise SystemExit(f"supplements name rows not in the reference: {sorted(unknown)}")
    out = [converted(row, None, supplements) for row in rows]
    (OUT_DIR / "train.json").write_text(json.dumps(out, indent=1) + "\n")
    print(f"train: {len(out)} rows")


if __name__ == "__main__":
    main()
