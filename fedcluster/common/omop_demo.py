"""The clinical demo as an OMOP Common Data Model v5.4 example, its cohort query and the
cohort's schema (``fedcluster partition --dataset clinical --format omop``;
docs/tutorials/omop-cohort.md).

Each site's patients (``clinical_demo.py``) become rows of five CDM tables, with the CDM's
column names and types: ``person`` (year of birth, gender concept, the patient id as
``person_source_value``), ``measurement`` (13 labs and vitals under LOINC-style concept
ids with their UCUM unit concepts, glucose and creatinine partly in mmol/L and umol/L as
hospitals record them; the latest on or before the index date is the demo's value, some have an earlier one, and a few a later one the cohort must not take; a
missing cell of the demo has none), ``observation`` (tobacco smoking status, a concept
value), ``condition_occurrence`` (the phenotype as a condition; the reference phenotype
has none) and ``concept`` (every concept used, named).

:func:`cohort_query` turns them back into one row per person, as of the index date
:data:`INDEX_DATE`: the person id, the condition (the label), age at index, sex and
smoking status (their concepts' names), and the latest value of each lab, each column
named by its concept's name, so Table 1 shows the concept names, with the UCUM code of
its unit beside it (``glucose_unit``): the schema's ``unit-column`` converts each row
from its own unit, or refuses the site's table naming the row and the unit it cannot
convert, so values in two units are never pooled as one. The query is plain SQL
that SQLite and PostgreSQL both run (a window function, no date arithmetic).
:func:`cohort_schema_toml` is the cohort's schema. The concept ids are in the style of
the OMOP vocabulary's (the example's own ``concept`` table names them); they are no
claim about a real vocabulary release.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import numpy as np

from fedcluster.common import clinical_demo

INDEX_DATE = dt.date(2025, 1, 1)
EHR = 32817  # the type concept of every record: from an EHR
# lab -> (concept id, concept name, LOINC code); the unit is the demo's (schema's) unit
LABS = {
    "glucose": (3004501, "Glucose [Mass/volume] in Serum or Plasma", "2345-7"),
    "creatinine": (3016723, "Creatinine [Mass/volume] in Serum or Plasma", "2160-0"),
    "hba1c": (3004410, "Hemoglobin A1c/Hemoglobin.total in Blood", "4548-4"),
    "cholesterol": (3027114, "Cholesterol [Mass/volume] in Serum or Plasma", "2093-3"),
    "hdl": (3007070, "Cholesterol in HDL [Mass/volume] in Serum or Plasma", "2085-9"),
    "ldl": (3028288, "Cholesterol in LDL [Mass/volume] in Serum or Plasma", "13457-7"),
    "triglycerides": (3022192, "Triglyceride [Mass/volume] in Serum or Plasma", "2571-8"),
    "crp": (3020460, "C reactive protein [Mass/volume] in Serum or Plasma", "1988-5"),
    "haemoglobin": (3000963, "Hemoglobin [Mass/volume] in Blood", "718-7"),
    "sodium": (3019550, "Sodium [Moles/volume] in Serum or Plasma", "2951-2"),
    "potassium": (3023103, "Potassium [Moles/volume] in Serum or Plasma", "2823-3"),
    "systolic_bp": (3004249, "Systolic blood pressure", "8480-6"),
    "bmi": (3038553, "Body mass index (BMI) [Ratio]", "39156-5"),
}
UNITS = {"mg/dL": 8840, "%": 8554, "mg/L": 8751, "g/dL": 8713, "mmol/L": 8753, "mmHg": 8876,
         "kg/m2": 9531, "umol/L": 8749}
#: The share of a site's glucose and creatinine measurements recorded in the other unit
#: (``clinical_demo.OTHER_UNITS``).
OTHER_UNIT_SHARE = 0.3
GENDERS = {"female": (8532, "FEMALE"), "male": (8507, "MALE")}
SMOKING_STATUS = (40766362, "Tobacco smoking status", "72166-2")
SMOKING = {"never": (45879404, "Never smoker"), "former": (45883458, "Former smoker"),
           "current": (45881517, "Current smoker")}
CONDITIONS = {"metabolic": (201826, "Type 2 diabetes mellitus"),
              "renal": (46271022, "Chronic kidney disease"),
              "inflammatory": (80809, "Rheumatoid arthritis")}
NO_CONDITION = "no condition"

# The CDM v5.4 tables used, column by column: i integer, b bigint, d date, t timestamp,
# n numeric, sN varchar(N); "!" not null.
CDM = {
    "person": "person_id i!, gender_concept_id i!, year_of_birth i!, month_of_birth i, "
              "day_of_birth i, birth_datetime t, race_concept_id i!, ethnicity_concept_id i!, "
              "location_id i, provider_id i, care_site_id i, person_source_value s50, "
              "gender_source_value s50, gender_source_concept_id i, race_source_value s50, "
              "race_source_concept_id i, ethnicity_source_value s50, ethnicity_source_concept_id i",
    "measurement": "measurement_id i!, person_id i!, measurement_concept_id i!, "
                   "measurement_date d!, measurement_datetime t, measurement_time s10, "
                   "measurement_type_concept_id i!, operator_concept_id i, value_as_number n, "
                   "value_as_concept_id i, unit_concept_id i, range_low n, range_high n, "
                   "provider_id i, visit_occurrence_id i, visit_detail_id i, "
                   "measurement_source_value s50, measurement_source_concept_id i, "
                   "unit_source_value s50, unit_source_concept_id i, value_source_value s50, "
                   "measurement_event_id b, meas_event_field_concept_id i",
    "observation": "observation_id i!, person_id i!, observation_concept_id i!, "
                   "observation_date d!, observation_datetime t, observation_type_concept_id i!, "
                   "value_as_number n, value_as_string s60, value_as_concept_id i, "
                   "qualifier_concept_id i, unit_concept_id i, provider_id i, "
                   "visit_occurrence_id i, visit_detail_id i, observation_source_value s50, "
                   "observation_source_concept_id i, unit_source_value s50, "
                   "qualifier_source_value s50, value_source_value s50, observation_event_id b, "
                   "obs_event_field_concept_id i",
    "condition_occurrence": "condition_occurrence_id i!, person_id i!, condition_concept_id i!, "
                            "condition_start_date d!, condition_start_datetime t, "
                            "condition_end_date d, condition_end_datetime t, "
                            "condition_type_concept_id i!, condition_status_concept_id i, "
                            "stop_reason s20, provider_id i, visit_occurrence_id i, "
                            "visit_detail_id i, condition_source_value s50, "
                            "condition_source_concept_id i, condition_status_source_value s50",
    "concept": "concept_id i!, concept_name s255!, domain_id s20!, vocabulary_id s20!, "
               "concept_class_id s20!, standard_concept s1, concept_code s50!, "
               "valid_start_date d!, valid_end_date d!, invalid_reason s1",
}


def cdm_tables():
    """The CDM tables as SQLAlchemy ``Table`` objects (one ``MetaData``)."""
    import sqlalchemy as sa

    kinds = {"i": sa.Integer, "b": sa.BigInteger, "d": sa.Date, "t": sa.DateTime,
             "n": lambda: sa.Numeric(asdecimal=False)}
    metadata = sa.MetaData()
    for name, spec in CDM.items():
        columns = []
        for item in spec.split(", "):
            column, kind = item.split()
            required = kind.endswith("!")
            kind = kind.rstrip("!")
            typ = sa.String(int(kind[1:])) if kind[0] == "s" else kinds[kind]()
            columns.append(sa.Column(column, typ, nullable=not required))
        sa.Table(name, metadata, *columns)
    return metadata


def _concepts() -> list[dict]:
    start, end = dt.date(1970, 1, 1), dt.date(2099, 12, 31)

    def concept(cid, name, domain, vocabulary, klass, code):
        return {"concept_id": cid, "concept_name": name, "domain_id": domain,
                "vocabulary_id": vocabulary, "concept_class_id": klass, "standard_concept": "S",
                "concept_code": code, "valid_start_date": start, "valid_end_date": end,
                "invalid_reason": None}

    rows = [concept(cid, name, "Measurement", "LOINC", "Lab Test", code)
            for cid, name, code in LABS.values()]
    rows += [concept(cid, unit, "Unit", "UCUM", "Unit", unit) for unit, cid in UNITS.items()]
    rows += [concept(cid, name, "Gender", "Gender", "Gender", name[0])
             for cid, name in GENDERS.values()]
    rows.append(concept(*SMOKING_STATUS[:2], "Observation", "LOINC", "Clinical Observation",
                        SMOKING_STATUS[2]))
    rows += [concept(cid, name, "Meas Value", "LOINC", "Answer", f"LA-{cid}")
             for cid, name in SMOKING.values()]
    rows += [concept(cid, name, "Condition", "SNOMED", "Clinical Finding", str(cid))
             for cid, name in CONDITIONS.values()]
    rows.append(concept(EHR, "EHR", "Type Concept", "Type Concept", "Type Concept", "OMOP4976890"))
    return rows


def _days(rng: np.random.Generator, low: int, high: int) -> dt.timedelta:
    return dt.timedelta(days=int(rng.integers(low, high + 1)))


def cdm_rows(site, index: int, seed: int) -> dict[str, list[dict]]:
    """One demo site (``clinical_demo._Site``, values in the schema's units) as CDM rows."""
    rng = np.random.default_rng([seed, index, 46])
    units_rng = np.random.default_rng([seed, index, 47])  # its own: the dates stay as they were
    cols = site.columns
    rows: dict[str, list[dict]] = {name: [] for name in CDM}
    for i in range(len(cols["patient_id"])):
        person = (index + 1) * 1_000_000 + i + 1
        sex = str(cols["sex"][i])
        rows["person"].append({
            "person_id": person, "gender_concept_id": GENDERS[sex][0],
            "year_of_birth": INDEX_DATE.year - int(cols["age"][i]), "race_concept_id": 0,
            "ethnicity_concept_id": 0, "person_source_value": str(cols["patient_id"][i]),
            "gender_source_value": sex})
        for lab, (concept, _, _) in LABS.items():
            value = float(cols[lab][i])
            if np.isnan(value):
                continue
            latest = INDEX_DATE - _days(rng, 0, 300)
            dated = [(latest, value)]
            if rng.random() < 0.5:  # an earlier value, which the cohort does not take
                dated.append((latest - _days(rng, 30, 700), round(value * rng.uniform(0.8, 1.2), 4)))
            if rng.random() < 0.1:  # one after the index date, which it must not take
                dated.append((INDEX_DATE + _days(rng, 1, 200), round(value * rng.uniform(0.8, 1.2), 4)))
            for date, number in dated:
                unit = clinical_demo._LABS[lab][0]
                if lab in clinical_demo.OTHER_UNITS and units_rng.random() < OTHER_UNIT_SHARE:
                    unit, factor = clinical_demo.OTHER_UNITS[lab]  # as the CSV demo writes it
                    number = float(format(number / factor, ".10g"))
                rows["measurement"].append({
                    "measurement_id": len(rows["measurement"]) + 1, "person_id": person,
                    "measurement_concept_id": concept, "measurement_date": date,
                    "measurement_type_concept_id": EHR, "value_as_number": number,
                    "unit_concept_id": UNITS[unit], "measurement_source_value": lab,
                    "unit_source_value": unit})
        smoking = str(cols["smoking"][i])
        if smoking:
            rows["observation"].append({
                "observation_id": len(rows["observation"]) + 1, "person_id": person,
                "observation_concept_id": SMOKING_STATUS[0],
                "observation_date": INDEX_DATE - _days(rng, 0, 300),
                "observation_type_concept_id": EHR, "value_as_concept_id": SMOKING[smoking][0],
                "value_source_value": smoking})
        phenotype = str(cols["phenotype"][i])
        if phenotype in CONDITIONS:
            rows["condition_occurrence"].append({
                "condition_occurrence_id": len(rows["condition_occurrence"]) + 1,
                "person_id": person, "condition_concept_id": CONDITIONS[phenotype][0],
                "condition_start_date": INDEX_DATE - _days(rng, 30, 2000),
                "condition_type_concept_id": EHR, "condition_source_value": phenotype})
    rows["concept"] = _concepts()
    return rows


def engine(url: str):
    """An engine for writing ``url`` (no pool: one writer, closed when done)."""
    import sqlalchemy as sa

    return sa.create_engine(url, poolclass=sa.pool.NullPool)


def write_omop(urls: list[str], n_sites: int, seed: int) -> list[dict[str, int]]:
    """Write each site's CDM tables into its database (tables of these names replaced).
    Returns, per site, the rows written per table."""
    metadata = cdm_tables()
    counts = []
    for index, (url, site) in enumerate(zip(urls, clinical_demo._generate(n_sites, seed))):
        rows = cdm_rows(site, index, seed)
        with engine(url).begin() as conn:
            metadata.drop_all(conn)
            metadata.create_all(conn)
            for name, table in metadata.tables.items():
                if rows[name]:
                    keys = [c.name for c in table.columns]
                    conn.execute(table.insert(), [{k: row.get(k) for k in keys} for row in rows[name]])
        counts.append({name: len(found) for name, found in rows.items()})
    return counts


def unit_column(lab: str) -> str:
    """The cohort's column that names the unit of each row's ``lab`` (a UCUM code)."""
    return f"{lab}_unit"


def cohort_query() -> str:
    """The cohort's SELECT (text for ``data-query-file``): one row per person, as of
    :data:`INDEX_DATE`, each column named as Table 1 shows it, and each lab's unit (the
    UCUM code of its ``unit_concept_id``; empty when the concept table has none)."""
    day = INDEX_DATE.isoformat()
    ids = ", ".join(str(concept) for concept, _, _ in LABS.values())
    pivot = ",\n".join(f"    MAX(CASE WHEN measurement_concept_id = {concept} THEN value_as_number "
                       f'END) AS "{name}"' for concept, name, _ in LABS.values())
    pivot += ",\n" + ",\n".join(f"    MAX(CASE WHEN measurement_concept_id = {concept} THEN "
                                 f"unit_code END) AS {unit_column(lab)}"
                                 for lab, (concept, _, _) in LABS.items())
    labs = ",\n".join([*(f'  labs."{name}"' for _, name, _ in LABS.values()),
                       *(f"  labs.{unit_column(lab)}" for lab in LABS)])
    return f"""-- One row per person of an OMOP CDM v5.4 database, as of the index date {day}:
-- the person's id and condition (the label, kept at the site), age at index, sex and
-- smoking status (their concepts' names), and the latest value of each lab on or before
-- the index date (a column per lab, named by its concept: Table 1 shows these names),
-- and the unit each value is in (the UCUM code of its unit concept: the schema converts
-- each row from it, and refuses a unit it does not know).
WITH latest AS (
  SELECT m.person_id, m.measurement_concept_id, m.value_as_number, u.concept_code AS unit_code,
         ROW_NUMBER() OVER (PARTITION BY m.person_id, m.measurement_concept_id
                            ORDER BY m.measurement_date DESC, m.measurement_id DESC) AS recency
  FROM measurement m
  LEFT JOIN concept u ON u.concept_id = m.unit_concept_id
  WHERE m.measurement_date <= '{day}' AND m.value_as_number IS NOT NULL
    AND m.measurement_concept_id IN ({ids})
), labs AS (
  SELECT person_id,
{pivot}
  FROM latest
  WHERE recency = 1
  GROUP BY person_id
), smoking AS (
  SELECT o.person_id, LOWER(c.concept_name) AS status,
         ROW_NUMBER() OVER (PARTITION BY o.person_id
                            ORDER BY o.observation_date DESC, o.observation_id DESC) AS recency
  FROM observation o
  JOIN concept c ON c.concept_id = o.value_as_concept_id
  WHERE o.observation_concept_id = {SMOKING_STATUS[0]} AND o.observation_date <= '{day}'
)
SELECT
  p.person_source_value AS person,
  COALESCE(LOWER(cc.concept_name), '{NO_CONDITION}') AS condition,
  {INDEX_DATE.year} - p.year_of_birth AS "age at index",
  LOWER(g.concept_name) AS sex,
  s.status AS "smoking status",
{labs}
FROM person p
JOIN concept g ON g.concept_id = p.gender_concept_id
LEFT JOIN smoking s ON s.person_id = p.person_id AND s.recency = 1
LEFT JOIN labs ON labs.person_id = p.person_id
LEFT JOIN condition_occurrence co ON co.person_id = p.person_id
LEFT JOIN concept cc ON cc.concept_id = co.condition_concept_id
ORDER BY p.person_id
"""


def cohort_schema_toml() -> str:
    """The cohort's schema (TOML): the query's columns, the labs in the demo's units and
    ranges, each converted row by row from the unit its row names (``unit-column``; the
    other units glucose and creatinine come in), missing cells imputed with the pooled
    mean."""
    lines = ["# The OMOP cohort of fedcluster/common/omop_demo.py (the query: cohort.sql).",
             'missing = "impute-mean"', ""]

    def column(name: str, *body: str) -> None:
        lines.extend(["[[columns]]", f"name = {json.dumps(name)}", *body, ""])

    column("person", 'type = "id"')
    column("condition", 'type = "label"')
    unit, (lo, hi) = clinical_demo.AGE[0], clinical_demo.AGE[1]
    column("age at index", f"unit = {json.dumps(unit)}", f"range = [{lo!r}, {hi!r}]")
    column("sex", 'type = "categorical"',
           f"categories = {json.dumps([name.lower() for _, name in GENDERS.values()])}")
    column("smoking status", 'type = "categorical"',
           f"categories = {json.dumps([name.lower() for _, name in SMOKING.values()])}",
           "missing-indicator = true")
    for lab, (_, name, _) in LABS.items():
        unit, (lo, hi) = clinical_demo._LABS[lab][:2]
        body = [f"unit = {json.dumps(unit)}", f"unit-column = {json.dumps(unit_column(lab))}"]
        if lab in clinical_demo.OTHER_UNITS:
            other, factor = clinical_demo.OTHER_UNITS[lab]
            body.append(f"units = {{ {json.dumps(other)} = {factor!r} }}")
        column(name, *body, f"range = [{lo!r}, {hi!r}]")
    return "\n".join(lines)


def write_cohort_files(out_dir: str | Path) -> tuple[Path, Path]:
    """``cohort.sql`` and ``schema.toml`` in ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    query, schema = out / "cohort.sql", out / "schema.toml"
    query.write_text(cohort_query(), encoding="utf-8")
    schema.write_text(cohort_schema_toml(), encoding="utf-8")
    return query, schema
