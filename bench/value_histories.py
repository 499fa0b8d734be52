"""Random histories of 50 versions over values, swept (issue 54, must-show 1).

``tests/test_value_histories.py`` runs 3 seeds a floor; this runs 10 (or ``--seeds``):
per floor (p_site 2, 3, 5) and seed, 50 versions of a 300-row CSV (``bench/versions.py``'s
kind of edit: rows deleted, cells corrected, rows appended) read by the real ClientApp
through its cache, every version asked ``stats``, ``kmeanspp`` (every group's mean and
count) and ``profile`` (its m2); then what the honest coordinator's totals give
differenced across versions, what the malicious one's groups give, and the test's own
audit of the site's record (a value or a row's change determined by the groups' sums and
the units' sums of squares together; a unit's sum of squares over fewer than 3 values).

Usage::

    python bench/value_histories.py [--seeds 10] [--out BENCHMARKS.md]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import report  # noqa: E402


def sweep(seeds: int, floors=(2, 3, 5)) -> list[str]:
    import test_value_histories as histories

    lines = ["| p_site | histories (50 versions each) | values from the totals | values from the "
             "groups | audit findings (values / changes) | seconds per history |",
             "|---|---|---|---|---|---|"]
    for p in floors:
        honest = malicious = values = changes = 0
        t0 = time.perf_counter()
        for seed in range(seeds):
            with tempfile.TemporaryDirectory() as work:
                by_totals, by_groups, (single, changed) = histories.history_findings(
                    Path(work), p, seed)
            honest += len(by_totals)
            malicious += len(by_groups)
            values += len(single)
            changes += len(changed)
        seconds = (time.perf_counter() - t0) / seeds
        lines.append(f"| {p} | {seeds} | {honest} | {malicious} | {values} / {changes} | "
                     f"{seconds:.1f} |")
        print(lines[-1], flush=True)
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    report.quiet_flower()
    lines = sweep(args.seeds)
    text = (report.header("Random histories of 50 versions over values (swept)") + "\n"
            + __doc__.split("Usage::")[0].split("\n\n", 1)[1].strip() + "\n\n"
            + "\n".join(lines) + "\n")
    report.write_section("value-histories", text, args.out)


if __name__ == "__main__":
    main()
