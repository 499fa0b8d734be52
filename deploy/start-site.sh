#!/usr/bin/env bash
# Start one site: a SuperNode that connects to the SuperLink over TLS, authenticated with
# the site's private key, with its data file and its own privacy floor. Its ClientApps run
# on this machine; only aggregates leave it.
#
# Usage: deploy/start-site.sh SITE_ID DATA_PATH SUPERLINK_HOST[:FLEET_PORT] CA_CERT PRIVATE_KEY
#   Without a port ([IPv6]:PORT for an IPv6 address), the installed Flower's Fleet API port:
#   9092 under Flower 1.39 (gRPC), 8000 under 1.40 and later (HTTP, the SuperLink's --port).
# Environment (defaults):
#   FEDCLUSTER_MIN_CLUSTER_SIZE=5   this site's privacy floor p (the server's may be higher)
#   FEDCLUSTER_LABEL_COLUMN=        a CSV column with labels (evaluation only, never sent)
#   FEDCLUSTER_SITE_PORT=9094       local port of the SuperNode's ClientApp API
#   FEDCLUSTER_CACHE_DIR=~/.cache/fedcluster  where the parsed data file is cached
#   FEDCLUSTER_TRUSTED_ENTITIES=    a trusted-entities YAML file: run only apps signed by
#                                   one of its keys (docs/how-to/signed-apps.md)
#   FEDCLUSTER_CONNECT_WAIT=600     seconds the SuperNode keeps trying to reach the SuperLink
#                                   (at start, or after losing it) before it gives up with
#                                   Flower's message and a non-zero exit; empty: forever
set -euo pipefail

if [ "$#" -ne 5 ]; then
    echo "usage: $0 SITE_ID DATA_PATH SUPERLINK_HOST[:FLEET_PORT] CA_CERT PRIVATE_KEY" >&2
    exit 2
fi
site=$1
data=$2
for file in "$data" "$4" "$5"; do
    [ -r "$file" ] || { echo "$file is not readable" >&2; exit 2; }
done
data=$(cd "$(dirname "$data")" && pwd)/$(basename "$data")
config="data-path=\"$data\" site-id=\"$site\" min-cluster-size=${FEDCLUSTER_MIN_CLUSTER_SIZE:-5}"
if [ -n "${FEDCLUSTER_LABEL_COLUMN:-}" ]; then
    config="$config label-column=\"$FEDCLUSTER_LABEL_COLUMN\""
fi
trust=()
if [ -n "${FEDCLUSTER_TRUSTED_ENTITIES:-}" ]; then
    [ -r "$FEDCLUSTER_TRUSTED_ENTITIES" ] || { echo "$FEDCLUSTER_TRUSTED_ENTITIES is not readable" >&2; exit 2; }
    trust=(--trusted-entities "$FEDCLUSTER_TRUSTED_ENTITIES")
fi

superlink=$3
if ! [[ $superlink =~ ^(\[.*\]|[^:]+):[0-9]+$ ]]; then
    # The installed Flower decides the port: 1.39's Fleet API is gRPC on a port of its own
    . "$(dirname "$0")/flower-layout.sh"
    superlink="$superlink:$FLEET_PORT"
    echo "Flower $FLOWER_VERSION: connecting to the Fleet API at $superlink" >&2
fi

wait_limit=()
if [ -n "${FEDCLUSTER_CONNECT_WAIT-600}" ]; then
    wait_limit=(--max-wait-time "${FEDCLUSTER_CONNECT_WAIT-600}")
fi

exec flower-supernode \
    --superlink "$superlink" \
    ${wait_limit[@]+"${wait_limit[@]}"} \
    --root-certificates "$4" \
    --auth-supernode-private-key "$5" \
    --host 127.0.0.1 \
    --port "${FEDCLUSTER_SITE_PORT:-9094}" \
    --node-config "$config" \
    ${trust[@]+"${trust[@]}"}
