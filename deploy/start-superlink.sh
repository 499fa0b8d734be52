#!/usr/bin/env bash
# Start the federation's SuperLink with TLS, SuperNode authentication and a database
# (so registered sites and their node ids survive a restart).
#
# Usage: deploy/start-superlink.sh CREDENTIALS_DIR STATE_DIR [extra flower-superlink flags]
# Environment (defaults):
#   FEDCLUSTER_BIND=0.0.0.0       address the SuperLink listens on
#   FEDCLUSTER_FLEET_PORT=9092    gRPC Fleet API: the sites connect here (open it to them)
#   FEDCLUSTER_CONTROL_PORT=8000  Control API (flwr run / flwr supernode register): keep
#                                 it reachable only from the operator's machine
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

exec flower-superlink \
    --ssl-ca-certfile "$creds/ca.crt" \
    --ssl-certfile "$creds/server.pem" \
    --ssl-keyfile "$creds/server.key" \
    --enable-supernode-auth \
    --database "$state/superlink.db" \
    --disable-runtime-dependency-installation \
    --fleet-api-type grpc-rere \
    --fleet-api-address "$bind:${FEDCLUSTER_FLEET_PORT:-9092}" \
    --host "$bind" \
    --port "${FEDCLUSTER_CONTROL_PORT:-8000}" \
    "$@"
