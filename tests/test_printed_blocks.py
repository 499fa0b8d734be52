"""Printed blocks a page's own Python makes: docs/how-to/privacy-budget.md's second run is
refused by the site whose budget the first spent, with the message the page shows (its
ledger, printed by ``fedcluster site ledger``, is compared in tests/test_docs.py)."""

from __future__ import annotations

from test_docs import ROOT, blocks, same_words, shown

PAGE = "docs/how-to/privacy-budget.md"


def test_the_refusal_privacy_budget_md_shows_is_the_second_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FEDCLUSTER_CACHE_DIR", str(tmp_path / "site-cache"))
    (code,) = [b.code for b in blocks(ROOT / PAGE) if b.language == "python"]
    namespace: dict = {"__name__": f"docs:{PAGE}"}
    exec(compile(code, PAGE, "exec"), namespace)  # noqa: S102
    refusal = namespace["second"].metrics["rejected-sites"]["0"]
    refusal = refusal[refusal.index("site policy dp-budget"):]
    assert same_words(refusal, shown(PAGE, "site policy dp-budget=1.2")), refusal
