"""A seeded synthetic "clinical" table split over sites, with its schema (issue 20).

The demo for tables read through a schema (``schema.py``, ``table_encoding.py``): the
shape a hospital export has, with the untidiness the schema exists for. Per site: a
``patient_id`` (the site's prefix, ``H1-000123``), the true ``phenotype`` (one of four
latent groups with distinct lab profiles, kept as the label), ``age``, ``sex``, ``ward``,
``smoking`` and 13 labs and vitals. Sites differ the way real ones do:

* sizes (300-700 rows) and phenotype mixes (a mild skew) differ;
* the column order is shuffled per site;
* every lab column has 5-30% empty cells, ``smoking`` some too;
* site 0 writes ``hemoglobin`` (an alias) for ``haemoglobin``;
* odd sites write ``icu``, a ward the schema does not list, for its ``other`` level;
* the last site writes glucose in mmol/L and creatinine in umol/L and says so in its
  header (``glucose [mmol/L]``), its numbers converted with the schema's factors.

``fedcluster partition --dataset clinical`` writes it. Everything is text generation
(numpy and ``csv``): no site code is imported, so ``common`` stays the lowest layer.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

PHENOTYPES = ("reference", "metabolic", "renal", "inflammatory")
# The pooled phenotype mix; each site's is drawn around it (Dirichlet, concentration 50,
# so shares move by a few points: a skew, not a different population).
_MIX = np.array([0.35, 0.25, 0.20, 0.20])
_MIX_CONCENTRATION = 50.0
_MIN_SHARE = 0.05  # every phenotype present at every site
SITE_ROWS = (300, 700)
LAB_MISSING = (0.05, 0.30)
SMOKING_MISSING = (0.05, 0.20)

# Per lab: unit, allowed range, decimals written, median per phenotype (order of
# PHENOTYPES) and the log-scale spread. Log-normal: lab values are positive and skewed.
# The ranges are wide enough that a generated value is never clipped in practice; the
# clip below makes "never out of range" a guarantee rather than a likelihood.
_LABS: dict[str, tuple[str, tuple[float, float], int, tuple[float, ...], float]] = {
    "glucose": ("mg/dL", (20, 800), 0, (92, 160, 104, 110), 0.15),
    "creatinine": ("mg/dL", (0.1, 20), 2, (0.85, 0.95, 2.9, 1.0), 0.2),
    "hba1c": ("%", (3, 20), 1, (5.3, 8.0, 5.8, 5.6), 0.08),
    "cholesterol": ("mg/dL", (50, 500), 0, (185, 230, 200, 180), 0.13),
    "hdl": ("mg/dL", (5, 150), 0, (58, 38, 44, 47), 0.18),
    "ldl": ("mg/dL", (10, 400), 0, (110, 148, 122, 108), 0.2),
    "triglycerides": ("mg/dL", (20, 2000), 0, (105, 240, 165, 135), 0.3),
    "crp": ("mg/L", (0, 500), 1, (1.5, 4.0, 6.0, 45.0), 0.6),
    "haemoglobin": ("g/dL", (3, 25), 1, (14.0, 14.3, 10.6, 12.0), 0.08),
    "sodium": ("mmol/L", (100, 180), 0, (140, 139, 135, 136), 0.02),
    "potassium": ("mmol/L", (1.5, 9), 1, (4.2, 4.3, 5.3, 4.0), 0.08),
    "systolic_bp": ("mmHg", (60, 260), 0, (121, 140, 150, 126), 0.1),
    "bmi": ("kg/m2", (10, 80), 1, (24, 33, 27, 25), 0.12),
}
# Other units the schema converts from: a value in the unit times the factor is in the
# column's unit (1 mmol/L glucose = 18.016 mg/dL; 1 umol/L creatinine = 0.011312 mg/dL).
OTHER_UNITS = {"glucose": ("mmol/L", 18.016), "creatinine": ("umol/L", 0.011312)}
ALIASES = {
    "patient_id": ("mrn",), "sex": ("gender",), "glucose": ("glu", "blood_glucose"),
    "creatinine": ("crea", "creat"), "haemoglobin": ("hemoglobin", "hb", "hgb"),
    "systolic_bp": ("sbp", "systolic"), "bmi": ("body_mass_index",),
}
ALIAS_SITE = (0, "haemoglobin", "hemoglobin")  # (site, column, the header it writes)
UNLISTED_WARD = "icu"  # odd sites' name for the schema's "other" ward

AGE = ("years", (0, 120), (45, 58, 66, 52), 14.0, (18, 100))  # unit, range, means, sd, clip
SEXES = ("female", "male")
_FEMALE = (0.55, 0.45, 0.40, 0.50)
WARDS = ("cardiology", "nephrology", "endocrinology", "general", "other")
_WARD_P = ((0.25, 0.05, 0.10, 0.45, 0.15), (0.15, 0.05, 0.50, 0.20, 0.10),
           (0.10, 0.60, 0.05, 0.15, 0.10), (0.15, 0.05, 0.05, 0.50, 0.25))
SMOKING = ("never", "former", "current")
_SMOKING_P = ((0.60, 0.25, 0.15), (0.45, 0.30, 0.25), (0.50, 0.35, 0.15), (0.40, 0.30, 0.30))


def clinical_schema_toml() -> str:
    """The demo's schema file (TOML): every column, its type, unit, range and aliases.

    Returns
    -------
    str
        Text for ``schema.load_schema``; missing cells of a feature are imputed with the
        pooled mean (``smoking``: the pooled share of each level, plus an indicator).
    """
    lines = ["# The clinical demo's agreed table (fedcluster/common/clinical_demo.py).",
             'missing = "impute-mean"', ""]

    def column(name: str, *body: str) -> None:
        lines.extend(["[[columns]]", f"name = {json.dumps(name)}"])
        if name in ALIASES:
            lines.append(f"aliases = {json.dumps(list(ALIASES[name]))}")
        lines.extend([*body, ""])

    column("patient_id", 'type = "id"')
    column("phenotype", 'type = "label"')
    column("age", f'unit = "{AGE[0]}"', f"range = [{AGE[1][0]!r}, {AGE[1][1]!r}]")
    column("sex", 'type = "categorical"', f"categories = {json.dumps(list(SEXES))}")
    column("ward", 'type = "categorical"', f"categories = {json.dumps(list(WARDS))}",
           'other = "other"')
    column("smoking", 'type = "categorical"', f"categories = {json.dumps(list(SMOKING))}",
           'missing = "impute-mean"', "missing-indicator = true")
    for name, (unit, (lo, hi), *_) in _LABS.items():
        body = [f"unit = {json.dumps(unit)}"]
        if name in OTHER_UNITS:
            other, factor = OTHER_UNITS[name]
            body.append(f"units = {{ {json.dumps(other)} = {factor!r} }}")
        column(name, *body, f"range = [{lo!r}, {hi!r}]")
    return "\n".join(lines)


@dataclass
class _Site:
    """One site's table before it is written: ``columns`` in the schema's units (numeric:
    float, NaN missing) or as written (text, "" missing); ``order``: the file's columns;
    ``units``: a column written in another unit; ``headers``: a column written under an
    alias."""

    columns: dict[str, np.ndarray]
    order: list[str]
    units: dict[str, str] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)


def _check_sites(n_sites: int) -> None:
    if isinstance(n_sites, bool) or not isinstance(n_sites, (int, np.integer)) or n_sites < 1:
        raise ValueError(f"the clinical demo needs n_sites >= 1 (an integer), got {n_sites!r}")


def _pick(rng: np.random.Generator, probs, group: np.ndarray, levels) -> np.ndarray:
    """Per row, one of ``levels`` drawn with its phenotype's probabilities."""
    cumulative = np.cumsum(np.asarray(probs), axis=1)[group]
    index = (rng.random(len(group))[:, None] > cumulative[:, :-1]).sum(axis=1)
    return np.asarray(levels, dtype=object)[index]


def _blank(rng: np.random.Generator, n: int, rates: tuple[float, float]) -> np.ndarray:
    """Which of ``n`` cells are missing: an exact count from a rate drawn in ``rates``,
    so the realised share is inside ``rates`` too (a per-cell coin could fall outside)."""
    low, high = int(np.ceil(rates[0] * n)), int(np.floor(rates[1] * n))
    count = int(np.clip(round(rng.uniform(*rates) * n), low, high))
    mask = np.zeros(n, dtype=bool)
    mask[rng.choice(n, size=count, replace=False)] = True
    return mask


def _site(index: int, n_sites: int, rng: np.random.Generator) -> _Site:
    n = int(rng.integers(SITE_ROWS[0], SITE_ROWS[1] + 1))
    mix = np.maximum(rng.dirichlet(_MIX_CONCENTRATION * _MIX), _MIN_SHARE)
    group = rng.choice(len(PHENOTYPES), size=n, p=mix / mix.sum())
    numbers = np.sort(rng.choice(1_000_000, size=n, replace=False))
    cols: dict[str, np.ndarray] = {
        "patient_id": np.array([f"H{index + 1}-{k:06d}" for k in numbers], dtype=object),
        "phenotype": np.asarray(PHENOTYPES, dtype=object)[group],
    }
    age = rng.normal(np.asarray(AGE[2])[group], AGE[3])
    cols["age"] = np.clip(np.round(age), *AGE[4])
    cols["sex"] = np.where(rng.random(n) < np.asarray(_FEMALE)[group], *SEXES).astype(object)
    ward = _pick(rng, _WARD_P, group, WARDS)
    if index % 2 == 1:  # some hospitals name their own wards: the schema's `other` takes them
        ward[ward == "other"] = UNLISTED_WARD
    cols["ward"] = ward
    smoking = _pick(rng, _SMOKING_P, group, SMOKING)
    smoking[_blank(rng, n, SMOKING_MISSING)] = ""
    cols["smoking"] = smoking
    for name, (_, (lo, hi), decimals, medians, spread) in _LABS.items():
        values = np.round(np.exp(rng.normal(np.log(np.asarray(medians)[group]), spread)),
                          decimals)
        # One written step inside the range: a value converted to another unit and back
        # may come out an ulp beyond the bound, which the schema would reject.
        step = 10.0 ** -decimals
        values = np.clip(values, lo + step, hi - step)
        values[_blank(rng, n, LAB_MISSING)] = np.nan
        cols[name] = values
    site = _Site(cols, [str(c) for c in rng.permutation(list(cols))])
    if index == n_sites - 1:
        site.units = {name: unit for name, (unit, _) in OTHER_UNITS.items()}
    if index == ALIAS_SITE[0]:
        site.headers[ALIAS_SITE[1]] = ALIAS_SITE[2]
    return site


def _generate(n_sites: int, seed: int) -> list[_Site]:
    """The sites' tables in the schema's units; site ``i`` depends only on (seed, i) but
    for the last site's units."""
    _check_sites(n_sites)
    children = np.random.SeedSequence(seed).spawn(int(n_sites))
    return [_site(i, int(n_sites), np.random.default_rng(s)) for i, s in enumerate(children)]


def _cell(name: str, value, converted: bool) -> str:
    if name not in _LABS and name != "age":
        return str(value)
    if np.isnan(value):
        return ""
    if converted:  # ten significant digits: the schema's conversion gets the value back
        return format(value / OTHER_UNITS[name][1], ".10g")
    decimals = _LABS[name][2] if name in _LABS else 0
    return f"{value:.{decimals}f}"


def _render(site: _Site) -> tuple[list[str], list[list[str]]]:
    header = [site.headers.get(name, name) + (f" [{site.units[name]}]" if name in site.units
                                              else "") for name in site.order]
    columns = [[_cell(name, v, name in site.units) for v in site.columns[name]]
               for name in site.order]
    return header, [list(row) for row in zip(*columns)]


def make_clinical(n_sites: int = 3, seed: int = 0) -> list[tuple[list[str], list[list[str]]]]:
    """The demo's sites as text, as their CSV files hold them.

    Parameters
    ----------
    n_sites : int
        Number of sites (>= 1); the last one writes glucose and creatinine in other units.
    seed : int
        The same seed gives the same tables.

    Returns
    -------
    list of (header, rows)
        Per site: the header cells and the data rows (lists of text cells, "" missing).

    Raises
    ------
    ValueError
        ``n_sites`` is not an integer >= 1.
    """
    return [_render(site) for site in _generate(n_sites, seed)]


def write_clinical(out_dir: str | Path, n_sites: int = 3, seed: int = 0) -> list[Path]:
    """Write ``schema.toml`` and ``site-0.csv`` ... ``site-{n_sites-1}.csv`` (UTF-8).

    Parameters
    ----------
    out_dir : str or Path
        Created if absent; existing files of these names are replaced.
    n_sites, seed : int
        As for :func:`make_clinical`.

    Returns
    -------
    list of Path
        The schema file, then the site files in site order.
    """
    tables = make_clinical(n_sites, seed)  # validates n_sites before anything is written
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    schema = out / "schema.toml"
    schema.write_text(clinical_schema_toml(), encoding="utf-8")
    paths = [schema]
    for i, (header, rows) in enumerate(tables):
        path = out / f"site-{i}.csv"
        with open(path, "w", encoding="utf-8", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(header)
            writer.writerows(rows)
        paths.append(path)
    return paths
