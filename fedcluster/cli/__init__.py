"""The ``fedcluster`` command.

``fedcluster run``        submit the app to a SuperLink, stream its log, exit with the run's end
``fedcluster simulate``   run a federation in this process (options = run-config keys)
``fedcluster choose-k``   run it for every k in a range and report the best k per criterion
``fedcluster partition``  write a built-in data set as one CSV per site (for deployments)
``fedcluster predict``    label a site's own rows with a trained model.json
``fedcluster site ledger`` summarise a site's disclosure ledger (for its data officer)
``fedcluster site check``  check a site's table against the agreed schema, sending nothing
``fedcluster app sign``   sign an app bundle (FAB); ``fedcluster app serve``: serve signed apps
``fedcluster report``     write a run directory's report.html (one self-contained page)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Literal, get_args, get_origin


from fedcluster.cli import flwr_run
from fedcluster.cli.predict import cmd_predict
from fedcluster.client_app.release import ledger as disclosure_ledger
from fedcluster.client_app.data.site_data import SiteDataError
from fedcluster.common.config import ConfigError, RunConfig, kebab_keys
from fedcluster.strategies.errors import FederationError


def _add_run_config_options(parser: argparse.ArgumentParser) -> None:
    """One ``--key`` option per run-config key, typed from the pydantic model."""
    for name, field in RunConfig.model_fields.items():
        flag = "--" + field.alias  # the key (``schema`` for the field ``schema_file``)
        kind = field.annotation
        about = f"{field.description}; " if field.description else ""
        about += f"default {field.default!r}" if field.default == "" else f"default {field.default}"
        if kind is bool:
            parser.add_argument(flag, type=lambda s: s.lower() in ("1", "true", "yes"), default=None,
                                metavar="true|false", help=about, dest=name)
        elif get_origin(kind) is Literal:
            parser.add_argument(flag, choices=get_args(kind), default=None, help=about, dest=name)
        else:
            caster = kind if kind in (int, float) else str
            parser.add_argument(flag, type=caster, default=None, help=about, dest=name)


def _run_config(args: argparse.Namespace) -> dict:
    """The run-config options given on the command line, kebab-case, output-dir defaulted."""
    config = {field.alias: getattr(args, name) for name, field in RunConfig.model_fields.items()
              if getattr(args, name, None) is not None}
    config.setdefault("output-dir", "outputs")
    return config


def _data_nodes(args: argparse.Namespace) -> list[dict]:
    """One node config per ``--data`` file (a site's data-path, loaded as in a deployment),
    with the column options."""
    from fedcluster.client_app.data_sources import is_database_url

    nodes = []
    for i, path in enumerate(args.data):  # a file, or a database's URL (with what to read)
        url = is_database_url(path)
        node = {"data-url" if url else "data-path": str(path), "site-id": str(i)}
        keys = ("columns", "id_column", "label_column") + (SQL_KEYS if url else ())
        node.update(kebab_keys({key: getattr(args, key) for key in keys
                                if getattr(args, key, None) is not None}))
        if getattr(args, "schema_file", None):  # every site reads its table through it
            node["schema-path"] = args.schema_file
        nodes.append(node)
    return nodes


SQL_KEYS = ("data_query", "data_query_file", "data_table")


def _add_site_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--num-sites", type=int, default=10,
                        help="sites cutting the built-in --dataset (without --data); default 10")
    parser.add_argument("--data", nargs="+", metavar="FILE",
                        help="one data file (CSV with a header, or .npy), or database URL "
                             "(node config data-url), per site instead of a dataset")
    for key in SQL_KEYS:  # node config keys data-query, data-query-file, data-table
        parser.add_argument("--" + key.replace("_", "-"), help="with --data URL: node config key")
    parser.add_argument("--columns", default=None, metavar="A,B,...",
                        help="with --data: the feature columns, by header name (default: all others)")
    parser.add_argument("--id-column", default=None, help="with --data: a column to drop (record ids)")
    parser.add_argument("--label-column", default=None,
                        help="with --data: a column kept at the site for evaluation only")


def cmd_simulate(args: argparse.Namespace) -> int:
    from fedcluster.simulation import run_in_process

    config = _run_config(args)
    if config.get("k-range"):
        raise ValueError("--k-range runs every k: use `fedcluster choose-k`")
    result = _on_sites(args, run_in_process, config)
    print(f"score {result.metrics['score']:.6g} after {result.metrics['rounds']} rounds")
    return 0


def _on_sites(args: argparse.Namespace, run, config: dict):
    """``run(nodes, config)`` on the sites of ``--data`` files or, without them, on
    ``--num-sites`` partitions of the built-in data set."""
    from fedcluster.simulation import site_nodes

    if args.data:
        return run(_data_nodes(args), config)
    with site_nodes(None, num_sites=args.num_sites) as nodes:
        return run(nodes, config)


def cmd_choose_k(args: argparse.Namespace) -> int:
    import json

    from fedcluster.server_app.choose_k import summary
    from fedcluster.simulation import serve_in_process

    config = _run_config(args)
    if not config.get("k-range"):
        raise ValueError("choose-k needs --k-range LO:HI, e.g. --k-range 2:15")
    record = _on_sites(args, serve_in_process, config)
    result = json.loads(str(record["choose-k"]))
    print(summary(result))
    return 0


def cmd_partition(args: argparse.Namespace) -> int:
    from fedcluster.common.site_exports import write_sites

    for line in write_sites(args.dataset, args.format, args.out, args.num_sites,
                            args.partitioning, args.seed, args.with_labels, args.database_url):
        print(line)
    return 0


def cmd_site_ledger(args: argparse.Namespace) -> int:
    lines = disclosure_ledger.read(args.path)
    print(disclosure_ledger.summary(lines, args.path))
    return 0


def cmd_site_check(args: argparse.Namespace) -> int:
    from fedcluster.client_app import site_check

    return site_check.command(args)


def cmd_app_sign(args: argparse.Namespace) -> int:
    import json

    from fedcluster.server_app import app_registry

    if (args.app or args.version) and not args.registry:
        raise ValueError("--app and --version name the app in a --registry")
    fab = Path(args.fab).read_bytes()
    record = app_registry.sign_fab(fab, args.key, args.key_id)
    if args.registry:
        path = app_registry.add_fab(args.registry, fab, args.app, args.version)
        app_id, version = app_registry.fab_metadata(fab)  # add_fab checked they agree
        app_registry.add_signature(args.registry, app_id, version, record)
        print(f"{path}: {app_id}=={version}, signed by {args.key_id}")
    else:
        print(json.dumps(record))
    print("a site trusts this signer with this line in its trusted-entities file:\n  "
          + app_registry.trusted_entity_line(args.key, args.key_id))
    return 0


def cmd_app_serve(args: argparse.Namespace) -> int:
    import logging

    from fedcluster.server_app import app_registry

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    app_registry.serve(args.directory, args.host, args.port)
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from fedcluster.server_app.run_report import write_report

    # A missing directory or model.json: FileNotFoundError naming the path (main prints it).
    print(write_report(Path(args.run_dir)))
    return 0


CHOOSE_K_HELP = """\
Run the federation once for every k in --k-range LO:HI (the configured --algorithm; each
k warm-started from the previous k's centroids with its largest cluster split, unless
--k-warm-start false), evaluate every k with the exact federated metrics, and report the
best k per criterion:

  elbow                   the knee of the inertia curve (kneedle: k and inertia scaled
                          to [0, 1], the point farthest below the chord)
  simplified-silhouette   the largest
  davies-bouldin          the smallest
  calinski-harabasz       the largest

Every figure is computed from the sites' sufficient statistics, never from rows. Writes
choose-k.json (best k per criterion, figures per k), choose-k.png and model-k<k>.json
(one model per k) to <output-dir>/<run-name>/. The options below are the run-config keys
(--n-clusters is ignored: every k in the range is run)."""

CHOOSE_K_EXAMPLES = """\
examples:
  fedcluster choose-k --k-range 2:15 --num-sites 10 --dataset digits --scale standard
  fedcluster choose-k --k-range 2:12 --data ward1.csv ward2.csv ward3.csv \\
      --id-column patient_id --columns age,bmi,glucose --scale standard --n-init 3

Page: docs/reference/cli.md#fedcluster-choose-k"""

#: Each command's example and its section of docs/reference/cli.md (its --help's end;
#: tests/test_cli.py parses every example and finds every section).
EXAMPLE = {
    "simulate": ("fedcluster simulate --dataset digits --num-sites 10 --n-clusters 10 "
                 "--output-dir outputs --run-name first", "fedcluster-simulate"),
    "partition": ("fedcluster partition --dataset clinical --num-sites 3 --out clinical",
                  "fedcluster-partition"),
    "predict": ("fedcluster predict --model outputs/first/model.json --data site-0.csv "
                "--out labels.csv", "fedcluster-predict"),
    "site": ("fedcluster site check site.csv --schema schema.toml", "fedcluster-site-check"),
    "site ledger": ("fedcluster site ledger cache/disclosure-ledger.jsonl",
                    "fedcluster-site-ledger"),
    "site check": ("fedcluster site check site.csv --schema schema.toml --min-cluster-size 5",
                   "fedcluster-site-check"),
    "app": ("fedcluster app serve registry --port 9080",
            "fedcluster-app-sign-fedcluster-app-serve"),
    "app sign": ("fedcluster app sign fedcluster.fab --key ~/.ssh/id_ed25519 --key-id reviewer-1 "
                 "--registry registry", "fedcluster-app-sign-fedcluster-app-serve"),
    "app serve": ("fedcluster app serve registry --port 9080",
                  "fedcluster-app-sign-fedcluster-app-serve"),
    "report": ("fedcluster report outputs/first", "fedcluster-report"),
}


def _shown(command: str) -> dict:
    """The add_parser keywords that end ``command``'s --help with its example and page."""
    example, section = EXAMPLE[command]
    return {"formatter_class": argparse.RawDescriptionHelpFormatter,
            "epilog": f"example:\n  {example}\n\nPage: docs/reference/cli.md#{section}"}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fedcluster", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Federated k-means and fuzzy c-means on Flower: sites keep their rows.",
        epilog="examples:\n  fedcluster simulate --num-sites 10 --n-clusters 10\n"
               "  fedcluster run . mylink --run-config \"n-clusters=4 min-sites=3\"\n"
               "  fedcluster site check site.csv --schema schema.toml\n"
               "each command's --help; the page: docs/reference/cli.md")
    sub = parser.add_subparsers(dest="command", required=True)
    flwr_run.add_parser(sub)

    sim = sub.add_parser("simulate", help="run a federation in this process", **_shown("simulate"))
    _add_site_options(sim)
    _add_run_config_options(sim)
    sim.set_defaults(func=cmd_simulate)

    choose = sub.add_parser(
        "choose-k", help="run the federation for every k in --k-range and choose k",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=CHOOSE_K_HELP, epilog=CHOOSE_K_EXAMPLES)
    _add_site_options(choose)
    _add_run_config_options(choose)
    choose.set_defaults(func=cmd_choose_k)

    part = sub.add_parser("partition", help="write a built-in dataset as one CSV per site",
                          **_shown("partition"))
    part.add_argument("--dataset", default="digits",
                      help="digits, blobs, or clinical (a synthetic hospital table with its "
                           "schema.toml: missing cells, units, aliases; label column included)")
    part.add_argument("--num-sites", type=int, default=3)
    part.add_argument("--partitioning", default="iid", help="not for clinical")
    part.add_argument("--seed", type=int, default=0)
    part.add_argument("--with-labels", action="store_true",
                      help="add a 'label' column (clinical always has its 'phenotype')")
    part.add_argument("--out", required=True, help="output directory")
    part.add_argument("--format", choices=("csv", "sqlite", "omop"), default="csv",
                      help="csv (one file per site, default); sqlite (one database per site, "
                           "table 'site'); omop (clinical only: OMOP CDM v5.4 tables per site, "
                           "with cohort.sql and its schema.toml)")
    part.add_argument("--database-url", nargs="+", metavar="URL",
                      help="with --format sqlite or omop: one SQLAlchemy URL per site to write "
                           "into (default: SQLite files site-<i>.db in --out); a password "
                           "comes from PGPASSWORD or PGPASSFILE, never the URL")
    part.set_defaults(func=cmd_partition)

    pred = sub.add_parser(
        "predict", help="label a site's own rows with model.json",
        description="Label a site's own rows with a trained model.json. A model trained "
                    "with a schema reads the raw table (.csv, .tsv, .parquet) through it "
                    "(columns by name or alias, units, categories, the run's fill and "
                    "scaling); --out then has one line per data row, -1 for a row dropped "
                    "by a drop-row column.", **_shown("predict"))
    pred.add_argument("--model", required=True)
    pred.add_argument("--data", required=True)
    pred.add_argument("--label-column", default=None,
                      help="a column to ignore (models without a schema)")
    pred.add_argument("--columns", default=None, metavar="A,B,...",
                      help="the feature columns, by header name, as the site trained with "
                           "(models without a schema)")
    pred.add_argument("--id-column", default=None,
                      help="a column to ignore, record ids (models without a schema)")
    pred.add_argument("--units", nargs="*", metavar="COLUMN=UNIT",
                      help="with a schema: the unit a column of this file is in, when its "
                           "header does not say")
    pred.add_argument("--out", required=True,
                      help="the labels, a CSV: one line per data row, in order: the id "
                           "(--id-column, or the schema's id column) if any, 'row' (1-based, "
                           "the header not counted) and 'cluster'")
    pred.set_defaults(func=cmd_predict)

    site = sub.add_parser("site", help="at a site: check its data as a run would (site "
                                       "check), read what it sent (site ledger)",
                          **_shown("site")).add_subparsers(
        dest="site_command", required=True)
    ledger = site.add_parser(
        "ledger", help="summarise a disclosure ledger: runs, rounds, what left the site, "
                       "refusals, the DP budget spent and left", **_shown("site ledger"))
    ledger.add_argument("path", help="the ledger file (node config ledger-path; default "
                                     "<cache-dir>/disclosure-ledger.jsonl)")
    ledger.set_defaults(func=cmd_site_ledger)
    check = site.add_parser(
        "check", help="check a data file against the agreed schema without contacting anyone: "
                      "rows, usable rows, missing cells, out-of-range cells, category counts",
        **_shown("site check"))
    check.add_argument("data", nargs="?",
                       help="the site's table (.csv, .tsv with a header row, or .parquet), or "
                            "its database's URL (node config data-url)")
    for key in SQL_KEYS:  # node config keys data-query, data-query-file, data-table
        check.add_argument("--" + key.replace("_", "-"), help="with a URL: node config key")
    check.add_argument("--schema", default=None,
                       help="the schema file (.toml or .json); default: --node-config's "
                            "schema-path")
    check.add_argument("--node-config", default=None, metavar="CONFIG",
                       help="a SuperNode's --node-config ('key=value ...' or a .toml): "
                            "validated, then its data checked as the flags would")
    check.add_argument("--run-config", default=None, metavar='"KEY=VALUE ..."',
                       help="a run's config, as `fedcluster run` takes it: judged as the site "
                            "will (allow-algorithms, require-dp, the replies' floor)")
    check.add_argument("--units", nargs="*", metavar="COLUMN=UNIT",
                       help="the unit a column of this file is in, when its header does not say")
    check.add_argument("--min-cluster-size", type=int, default=None, metavar="P",
                       help="this site's own floor p_site (node config min-cluster-size): the "
                            "size of the groups it answers from; default 2")
    check.add_argument("--history", metavar="NAME", help="the node config's history (named)")
    check.add_argument("--cache-dir", default=None, metavar="DIR",
                       help="the site's cache-dir (node config): report the groups the site "
                            "would answer from next (its history there: the rows waiting "
                            "too), on a scratch copy; without it, made here alone")
    check.add_argument("--record", action="store_true", help="write the table into the "
                       "site's history in --cache-dir (it then counts as answered from)")
    check.add_argument("--cost-k", default="2-10", metavar="K",
                       help="the k of the cost table (what the groups at this site's p and at "
                            "2, 5, 10 cost its own k-means): LO-HI, a list 3,5,8 or one k; "
                            "default 2-10")
    check.add_argument("--cost-scale", default="standard", choices=("standard", "none"),
                       help="the cost table's space: the rows z-scored with this site's "
                            "moments (default, as scale = standard) or as encoded")
    check.add_argument("--no-cost-table", action="store_true",
                       help="leave the cost table out (it fits k-means several times: a few "
                            "seconds at 10,000 rows, a sample of 10,000 rows above)")
    check.set_defaults(func=cmd_site_check)

    apps = sub.add_parser("app", help="sign app bundles (FABs) and serve them to the "
                                      "SuperLink (docs/how-to/signed-apps.md)",
                          **_shown("app")).add_subparsers(
        dest="app_command", required=True)
    sign = apps.add_parser("sign", help="sign a FAB (flwr build) with an Ed25519 key; "
                                        "with --registry, add both to a registry",
                           **_shown("app sign"))
    sign.add_argument("fab", help="the .fab file")
    sign.add_argument("--key", required=True,
                      help="the signer's Ed25519 private key, OpenSSH format (ssh-keygen -t ed25519)")
    sign.add_argument("--key-id", required=True,
                      help="the name sites list the public key under in their trusted-entities file")
    sign.add_argument("--registry", default=None, metavar="DIR",
                      help="add the FAB and the signature to this registry directory "
                           "(without it: print the signature record)")
    sign.add_argument("--app", default=None, metavar="@ACCOUNT/APP",
                      help="with --registry: the app id (default and only allowed value: the "
                           "FAB's own @publisher/name)")
    sign.add_argument("--version", default=None, metavar="X.Y.Z",
                      help="with --registry: the version (default: the FAB's own)")
    sign.set_defaults(func=cmd_app_sign)
    serve = apps.add_parser("serve", help="serve a registry directory over Flower Hub's API "
                                          "(start the SuperLink with FLWR_SUPERGRID_API_URL)",
                            **_shown("app serve"))
    serve.add_argument("directory", help="the registry directory")
    serve.add_argument("--host", default="127.0.0.1", help="default 127.0.0.1")
    serve.add_argument("--port", type=int, default=9080, help="default 9080")
    serve.set_defaults(func=cmd_app_serve)

    report = sub.add_parser(
        "report", help="write RUN_DIR/report.html: what was run, the metrics, Table 1 by "
                       "cluster, the pictures and what each site sent (one file, no network)",
        **_shown("report"))
    report.add_argument("run_dir", metavar="RUN_DIR",
                        help="a run's output directory (<output-dir>/<run-name>, with model.json)")
    report.set_defaults(func=cmd_report)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ConfigError, SiteDataError, ValueError, OSError) as err:
        print(f"fedcluster: error: {err}", file=sys.stderr)
        return 2
    except FederationError as err:  # the run could not go on: its reason, not a traceback
        print(f"fedcluster: the run stopped: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
