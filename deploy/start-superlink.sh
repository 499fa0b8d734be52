#!/usr/bin/env bash
# Start the federation's SuperLink with TLS, SuperNode authentication and a database
# (so registered sites and their node ids survive a restart).
#
# Usage: deploy/start-superlink.sh CREDENTIALS_DIR STATE_DIR [extra flower-superlink flags]
# Environment (defaults):
#   FEDCLUSTER_BIND=0.0.0.0       address the SuperLink listens on
#   FEDCLUSTER_FLEET_PORT=9092    Flower 1.39: the gRPC Fleet API, where the sites connect
#                                 (open it to them)
#   FEDCLUSTER_CONTROL_PORT=8000  Control API (flwr run / flwr supernode register); under
#                                 1.39 keep it reachable only from the operator's machine.
#                                 Flower 1.40 and later serve the Fleet API here too (over
#                                 HTTP): the sites connect to this port, and a firewall or
#                                 reverse proxy must let them reach only the Fleet API's
#                                 paths (docs/how-to/multi-site-tls.md, "Ports")
set -euo pipefail

if [ "$#" -lt 2 ]; then
    echo "usage: $0 CREDENTIALS_DIR STATE_DIR [flower-superlink flags]" >&2
    exit 2
fi
creds=$1
state=$2
shift 2
for file in ca.crt server.pem server.key; do
    [ -r "$creds/$file" ] || { echo "$creds/$file is missing: run deploy/make-credentials.sh" >&2; exit 2; }
done
mkdir -p "$state"
bind=${FEDCLUSTER_BIND:-0.0.0.0}

# The installed Flower decides the layout: 1.39's Fleet API is gRPC on a port of its own
. "$(dirname "$0")/flower-layout.sh"
fleet=()
if [ "$FLEET_GRPC" = 1 ]; then
    fleet=(--fleet-api-type grpc-rere --fleet-api-address "$bind:$FLEET_PORT")
    echo "Flower $FLOWER_VERSION: the sites connect to the gRPC Fleet API on port $FLEET_PORT" >&2
else
    echo "Flower $FLOWER_VERSION: the sites connect to the Fleet API (HTTP) on port $FLEET_PORT, the Control API's" >&2
fi

exec flower-superlink \
    --ssl-ca-certfile "$creds/ca.crt" \
    --ssl-certfile "$creds/server.pem" \
    --ssl-keyfile "$creds/server.key" \
    --enable-supernode-auth \
    --database "$state/superlink.db" \
    --disable-runtime-dependency-installation \
    ${fleet[@]+"${fleet[@]}"} \
    --host "$bind" \
    --port "${FEDCLUSTER_CONTROL_PORT:-8000}" \
    "$@"
