"""The ``fedcluster`` command.

``fedcluster simulate``   run a federation in this process (options = run-config keys)
``fedcluster partition``  write a built-in data set as one CSV per site (for deployments)
``fedcluster predict``    label a site's own rows with a trained model.json
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from fedcluster.common.config import ConfigError, RunConfig
from fedcluster.common.data import SiteDataError


def _add_run_config_options(parser: argparse.ArgumentParser) -> None:
    """One ``--key`` option per run-config key, typed from the pydantic model."""
    for name, field in RunConfig.model_fields.items():
        flag = "--" + name.replace("_", "-")
        kind = field.annotation
        if kind is bool:
            parser.add_argument(flag, type=lambda s: s.lower() in ("1", "true", "yes"), default=None,
                                metavar="true|false", help=f"default {field.default}")
        else:
            caster = kind if kind in (int, float) else str
            parser.add_argument(flag, type=caster, default=None, help=f"default {field.default}")


def cmd_simulate(args: argparse.Namespace) -> int:
    from fedcluster.simulation import simulate

    config = {
        name: getattr(args, name)
        for name in RunConfig.model_fields
        if getattr(args, name, None) is not None
    }
    config.setdefault("output_dir", "outputs")
    if args.data:
        # Each file is a site's data-path, loaded by the ClientApp as in a deployment.
        from fedcluster.simulation import run_in_process

        nodes = [{"data-path": str(p), "site-id": str(i)} for i, p in enumerate(args.data)]
        result = run_in_process(nodes, {k.replace("_", "-"): v for k, v in config.items()})
    else:
        result = simulate(num_sites=args.num_sites, **config)
    print(f"score {result.metrics['score']:.6g} after {result.metrics['rounds']} rounds")
    return 0


def cmd_partition(args: argparse.Namespace) -> int:
    from fedcluster.common.data import load_builtin, partition

    X, y = load_builtin(args.dataset, args.seed)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    header = ",".join(f"x{j}" for j in range(X.shape[1]))
    for i, rows in enumerate(partition(y, args.num_sites, args.partitioning, args.seed)):
        path = out / f"site-{i}.csv"
        data = np.column_stack([X[rows], y[rows]]) if args.with_labels else X[rows]
        names = header + (",label" if args.with_labels else "")
        np.savetxt(path, data, delimiter=",", header=names, comments="", fmt="%.17g")
        print(f"{path}: {len(rows)} rows")
    return 0


def cmd_predict(args: argparse.Namespace) -> int:
    from fedcluster.common.data import load_site_file
    from fedcluster.common.model import Model

    try:
        model = Model.load(args.model)
    except (OSError, ValueError, KeyError) as err:
        raise ValueError(f"{args.model}: not a fedcluster model.json ({err})") from None
    site = load_site_file(args.data, label_column=args.label_column)
    if site.n_features != model.n_features:
        raise SiteDataError(
            f"{args.data}: has {site.n_features} feature columns, the model expects "
            f"{model.n_features}"
        )
    if model.feature_names and site.feature_names and list(site.feature_names) != model.feature_names:
        raise SiteDataError(
            f"{args.data}: header {list(site.feature_names)} differs from the model's "
            f"features {model.feature_names}"
        )
    labels = model.predict(site.X)
    np.savetxt(args.out, labels, fmt="%d", header="cluster", comments="")
    print(f"{args.out}: {len(labels)} labels")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fedcluster", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    sim = sub.add_parser("simulate", help="run a federation in this process")
    sim.add_argument("--num-sites", type=int, default=10, help="sites for a built-in dataset")
    sim.add_argument("--data", nargs="+", help="one data file per site instead of a dataset")
    _add_run_config_options(sim)
    sim.set_defaults(func=cmd_simulate)

    part = sub.add_parser("partition", help="write a built-in dataset as one CSV per site")
    part.add_argument("--dataset", default="digits")
    part.add_argument("--num-sites", type=int, default=3)
    part.add_argument("--partitioning", default="iid")
    part.add_argument("--seed", type=int, default=0)
    part.add_argument("--with-labels", action="store_true", help="add a 'label' column")
    part.add_argument("--out", required=True, help="output directory")
    part.set_defaults(func=cmd_partition)

    pred = sub.add_parser("predict", help="label a site's own rows with model.json")
    pred.add_argument("--model", required=True)
    pred.add_argument("--data", required=True)
    pred.add_argument("--label-column", default=None, help="a column to ignore")
    pred.add_argument("--out", required=True)
    pred.set_defaults(func=cmd_predict)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ConfigError, SiteDataError, ValueError, OSError) as err:
        print(f"fedcluster: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
