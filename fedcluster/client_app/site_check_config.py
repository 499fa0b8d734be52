"""The configs ``fedcluster site check`` judges a site by (issue 70): the node config a
SuperNode would start with (parsed as Flower parses it, a value it cannot read named by
its key), a run's config, and what the site's own policy makes of them: the same checks
the site's ClientApp makes before it answers (``site_policy.py``), made on the groups
the check built, so that a file the run would refuse does not pass the check.

- ``min-site-rows`` (default 10) and the rows in groups, waiting or held back: as
  ``site_policy.check_site_rows``;
- with the run's config (``--run-config``): its ``algorithm`` against the site's
  ``allow-algorithms``, a plain run against ``require-dp``, and the floor the replies
  are held to, max(the run's ``min-cluster-size``, the site's own).
"""

from __future__ import annotations

import re

from fedcluster.client_app import site_policy
from fedcluster.client_app.node_config import NodeConfig, parse_node_config


def node_for(node: NodeConfig | None, floor: int) -> NodeConfig:
    """The node config a check judges by: the one given, else every default at the
    check's floor."""
    return node if node is not None else parse_node_config({"min-cluster-size": floor})


def parsed_run_config(text: str | None) -> dict | None:
    """``--run-config "key=value ..."`` as ``flwr run`` takes it, validated as the
    ServerApp validates it (a ConfigError names the key)."""
    if not text:
        return None
    import click
    from flwr.common.config import parse_config_args

    from fedcluster.common.config import parse_run_config

    try:
        values = parse_config_args([text])
    except click.ClickException as err:
        raise ValueError(f"--run-config: {err.message}") from None
    parse_run_config(values)
    return values


def findings(node: NodeConfig, groups, run_config: dict | None) -> tuple[list[str], str | None]:
    """The lines the check prints of the policy, and the refusal a run would meet
    (None: the site would take part)."""
    refusal = None
    try:
        site_policy.check_site_rows(node, groups.n_rows, groups.waiting, groups.held_back,
                                    groups.held_back_why)
        lines = [f"Site policy: min-site-rows={node.min_site_rows}: {groups.n_rows} row(s) in "
                 "groups, the site takes part"]
    except site_policy.PolicyRefusal as err:
        refusal = str(err)
        lines = [f"Site policy: REFUSED, a run would get this error from the site: {err}"]
    if run_config is not None:
        from fedcluster.common.config import parse_run_config

        config = parse_run_config(run_config)
        try:
            site_policy.check_algorithm(node, config.algorithm)
            if node.require_dp and not config.private:
                raise site_policy.PolicyRefusal(
                    "site policy require-dp=true: the run is not differentially private "
                    "(run config dp-epsilon is 0); this site answers only DP tasks")
            floor = max(node.min_cluster_size, config.min_cluster_size)
            lines.append(f"The run ({config.algorithm}): taken part in; every reply held to "
                         f"p = {floor} (the larger of the run's min-cluster-size "
                         f"{config.min_cluster_size} and this site's {node.min_cluster_size})")
        except site_policy.PolicyRefusal as err:
            refusal = refusal or str(err)
            lines.append(f"The run ({config.algorithm}): REFUSED by the site's policy: {err}")
    return lines, refusal


# Flower's pattern for one key=value of --node-config (flwr.common.config.parse_config_args)
_KEY_VALUE = re.compile(r"(\S+?)=(\'[^\']*\'|\"[^\"]*\"|\S+)")


def checked_node_config(text: str):
    """The node config ``flower-supernode --node-config TEXT`` would start with, parsed as
    Flower parses it and validated as the site's ClientApp will (a ConfigError names the
    key, and an unknown one the key meant); prints that it is valid."""
    import click
    from flwr.common.config import parse_config_args

    from fedcluster.client_app.node_config import parse_node_config

    try:
        values = parse_config_args([text])
    except click.ClickException as err:
        for key, value in _KEY_VALUE.findall(text):  # the pair Flower could not read
            try:
                parse_config_args([f"{key}={value}"])
            except click.ClickException:
                raise ValueError(
                    f"--node-config key {key!r}: {value!r} is not a value Flower reads (a "
                    f"number, true or false, or text in double quotes: {key}=\"{value}\"); "
                    "flower-supernode stops with Flower's own message on it") from None
        raise ValueError(f"--node-config: {err.message}") from None
    if not text.strip().endswith(".toml"):  # what Flower's parser skips without a word
        ignored = _KEY_VALUE.sub(" ", text).split()
        if ignored:
            raise ValueError(f"--node-config: {' '.join(ignored)!r} is not key=value; Flower "
                             "skips such text without a word, so the SuperNode would start "
                             "without it (the form: 'key1=\"text\" key2=3 key3=true')")
    node = parse_node_config(values)
    print(f"node config: valid ({', '.join(sorted(values)) or 'no keys: every default'})")
    return node


def with_node_config(given: dict, node) -> dict:
    """The check's settings (``given``: the command's, None where not given), each taken
    from the node config where not given."""
    from_node = {"data": node.data_path or node.data_url, "schema": node.schema_path,
                 "min_cluster_size": node.min_cluster_size, "cache_dir": node.cache_dir,
                 "data_query": node.data_query, "data_query_file": node.data_query_file,
                 "data_table": node.data_table, "history": node.history}
    return {key: value if given.get(key) is None else given[key]
            for key, value in from_node.items()}
