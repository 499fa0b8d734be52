"""The randomized adversary against a site's record, swept (issue 69, must-show 2).

``tests/test_record_adversary.py`` runs one short sequence per floor; this runs many:
per floor and seed, a sequence of random tasks with crafted parameters (every group's
mean and count, centroids on group means, lines of centroids, k above the groups, a
fuzzifier near 1, the report's evaluation and Table 1's profile at any of them, versions
of the file, runs asking another ``missing``, two processes asking the report at once
on one cache) against the real ClientApp of a site reading a CSV with missing cells
and a row far out in a quiet feature; then the suite's own audit
(``tests/record_check.py``) of the record: entries that are not their rows' functions,
and what the record's span gives (a combination of fewer than p values, a value or a
row's change determined, a sum the p% rule withheld). Each sequence is also run against
the site without its report's defences (the release step judging nothing), which shows
what the adversary finds where nothing stops it.

Usage::

    python bench/record_adversary.py [--seeds 20] [--steps 30] [--out BENCHMARKS.md]
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


def sweep(seeds: int, steps: int, floors=(2, 3, 5)) -> list[str]:
    import pytest

    import test_record_adversary as adversary

    lines = ["| p_site | sequences | steps each | defended: entries wrong / span findings | "
             "unguarded: sequences with a finding | seconds per sequence |",
             "|---|---|---|---|---|---|"]
    for p in floors:
        wrong = found = bare = 0
        t0 = time.perf_counter()
        for seed in range(seeds):
            with tempfile.TemporaryDirectory() as work:
                entries, span = adversary.run_sequence(Path(work), seed, p, steps).check()
                wrong += bool(entries)
                found += bool(span)
        seconds = (time.perf_counter() - t0) / seeds
        with pytest.MonkeyPatch.context() as patch:
            adversary.unguarded(patch)
            for seed in range(seeds):
                with tempfile.TemporaryDirectory() as work:
                    _, span = adversary.run_sequence(Path(work), seed, p, steps).check()
                    bare += bool(span)
        lines.append(f"| {p} | {seeds} | {steps} | {wrong} / {found} | {bare} of {seeds} | "
                     f"{seconds:.1f} |")
        print(lines[-1], flush=True)
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    report.quiet_flower()
    lines = sweep(args.seeds, args.steps)
    text = (report.header("The randomized adversary against the record (swept)") + "\n"
            + __doc__.split("Usage::")[0].split("\n\n", 1)[1].strip() + "\n\n" + "\n".join(lines) + "\n")
    report.write_section("record-adversary", text, args.out)


if __name__ == "__main__":
    main()
