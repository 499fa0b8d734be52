"""How a Table 1 cell is written (``table1.py`` lays the cells out): numbers to 3
significant digits, counts, percentages, "n (%)", "mean (SD)", "median [Q1, Q3]", and
the markers a figure the small-cell rule withholds shows instead (``"<p"``,
``"suppressed"``, an interval ``"a-b"``)."""

from __future__ import annotations

import math

#: A figure that is not available (not computed, or not released).
UNAVAILABLE = "-"


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value)


def format_number(value) -> str:
    """A mean, SD or quantile: 3 significant digits, at most 2 decimals for values >= 1
    (``123``, ``45.7``, ``5.43``, ``0.0123``); text (``"<p"``) as it is; ``""``/NaN -> "-"."""
    if isinstance(value, str):
        return value or UNAVAILABLE
    if not _number(value):
        return UNAVAILABLE
    size = abs(value)
    if size >= 100:
        return f"{value:.0f}"
    if size >= 10:
        return f"{value:.1f}"
    if size >= 1:
        return f"{value:.2f}"
    return f"{value:#.3g}"  # "#": keep trailing zeros, 0.900 not 0.9


def format_count(value) -> str:
    """A count (noisy DP counts are rounded), or its text."""
    if isinstance(value, str):
        return value or UNAVAILABLE
    return f"{value:.0f}" if _number(value) else UNAVAILABLE


def format_percent(value) -> str:
    if isinstance(value, str):
        return value or UNAVAILABLE
    return f"{value:.1f}" if _number(value) else UNAVAILABLE


def _n_pct(n, pct) -> str:
    count = format_count(n)
    # A withheld or unavailable count has no share: show the count's text only.
    if count == UNAVAILABLE or not (_number(n) or _lower_end(n) is not None):
        return count
    share = format_percent(pct)
    return count if share == UNAVAILABLE else f"{count} ({share})"


def _pair(first, second, wrap: str) -> str:
    head = format_number(first)
    if head == UNAVAILABLE or head.startswith("<"):
        return head
    return f"{head} {wrap.format(format_number(second))}"


def _at_most(sd, lowered) -> object:
    """An SD as shown: ``"\u2264x"`` where it is the most its column's range allows."""
    return f"\u2264{format_number(sd)}" if lowered and _number(sd) else sd


def _median(median, q1, q3) -> str:
    head = format_number(median)
    if head == UNAVAILABLE or head.startswith("<"):
        return head
    return f"{head} [{format_number(q1)}, {format_number(q3)}]"


def _why_not(n) -> str:
    """A mean's cell where the mean is not shown: its n's marker (``n <10``, ``n
    suppressed``), or "-"."""
    return f"n {n}" if isinstance(n, str) and n and _lower_end(n) is None else UNAVAILABLE


def _lower_end(value) -> float | None:
    """A count's value, or an interval's (``"a-b"``) lower end; None for a marker."""
    if _number(value):
        return float(value)
    if isinstance(value, str) and value.count("-") == 1:
        low, _, high = value.partition("-")
        try:
            float(high)
            return float(low)
        except ValueError:
            return None
    return None


def _n_equals(size) -> str:
    text = format_count(size)
    # "n < 2" reads as a sentence where "n = <2" does not.
    return f"n {text[0]} {text[1:]}" if text.startswith("<") else f"n = {text}"
