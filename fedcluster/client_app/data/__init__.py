"""The site's data layer: the one place a site's rows are held (docs/explanation/architecture.md).

Rows come in (a source read into the memory-mapped cache) and leave as groups:

- **sources**: ``site_data.py`` (``SiteData``, the cache, a plain CSV or ``.npy``),
  ``tables.py`` (CSV parsing), ``table_files.py`` (a table's cells: CSV, TSV, Parquet),
  ``schema_table.py`` (a table read through the agreed schema), ``sql_*.py`` (a SQL
  database's query result, streamed through the schema into the same cache);
- **where rows become groups**: ``grouping.py``, ``group_stats.py``, ``group_table.py``
  (``site_groups``: the ``SiteGroups`` every task receives), ``group_entries.py``, and
  ``versions/`` (a new version of the data only ever discloses groups);
- **what the groups cost**: ``group_cost.py`` (the site check's cost table: k-means on
  the site's groups against on its rows, for its data officer's eyes; sends nothing).

What leaves this package is a ``SiteGroups`` (``client_app/site_groups.py``, which holds
no row) or, for differential privacy alone, ``ClippedRows`` (``client_app/private_rows.py``).
The site tasks import nothing from here (``tests/test_site_groups.py`` checks).
"""
