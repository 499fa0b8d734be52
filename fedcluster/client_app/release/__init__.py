"""Where values leave a site: the one release step and its rules.

Rows end in ``client_app/data/`` (the site's data layer), which cuts them into groups.
Every value a site sends leaves through this package:

- ``gate.py``: the release step every reply takes, plain, secure or differentially
  private: it applies the rules a reply's values need (the group floor on per-cluster
  figures, counts under the floor shown as ``"<p"``), says what the reply is as a
  function of the site's data (which group table, which moments), and records it in
  the site's disclosure ledger (``ledger.py``) before it leaves;
- ``record/``: the site's one record of every group it ever released values from (every
  run, task, version, report partition and process), its stand-ins, and the one lock
  under which a table is judged and a reply answered;
- ``audit/``: the one audit, which judges new groups against the whole record (row
  versions, values, first and second moments, the p% rule's withheld cells) and decides
  every component;
- the rules, applied where a table of values is made: ``lone_cells.py`` (a feature's
  present cells in a group number 0 or at least p), ``spreads.py`` (no second moment of
  fewer than 3 rows: spread units), ``dominance.py`` (no spread from which one row can
  be estimated closely), ``floor.py`` (the group floor on what a reply reports per
  cluster).

docs/explanation/privacy-model.md says what each rule does and does not stop.
"""
