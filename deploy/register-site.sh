#!/usr/bin/env bash
# Register a site's public key with the SuperLink (run by the SuperLink's operator). Only
# registered sites may connect; the printed node id is the site's for good (kept in the
# SuperLink's database across restarts).
#
# Usage: deploy/register-site.sh CONNECTION PUBLIC_KEY [SITE_NAME]
#   CONNECTION: a SuperLink connection in $FLWR_HOME/config.toml (see connect.sh)
set -euo pipefail

if [ "$#" -lt 2 ]; then
    echo "usage: $0 CONNECTION PUBLIC_KEY [SITE_NAME]" >&2
    exit 2
fi
connection=$1
key=$2
[ -r "$key" ] || { echo "public key $key is not readable" >&2; exit 2; }
if [ "$#" -ge 3 ]; then
    exec flwr supernode register "$key" "$connection" --name "$3"
fi
exec flwr supernode register "$key" "$connection"
