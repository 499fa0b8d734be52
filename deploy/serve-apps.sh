#!/usr/bin/env bash
# Serve the app registry (deploy/sign-app.sh fills it) to the SuperLink, over the two
# endpoints of Flower Hub that the SuperLink calls. Run it on the coordinator, next to the
# SuperLink, and start the SuperLink with
#   FLWR_SUPERGRID_API_URL=http://127.0.0.1:9080/v1 deploy/start-superlink.sh ...
# Then `flwr run @account/app==x.y.z CONNECTION` runs the registry's FAB with its signatures.
#
# Usage: deploy/serve-apps.sh REGISTRY_DIR
# Environment (defaults):
#   FEDCLUSTER_REGISTRY_BIND=127.0.0.1  listening address (only the SuperLink needs it)
#   FEDCLUSTER_REGISTRY_PORT=9080       listening port
set -euo pipefail

if [ "$#" -ne 1 ]; then
    echo "usage: $0 REGISTRY_DIR" >&2
    exit 2
fi
[ -d "$1" ] || { echo "$1 is not a directory" >&2; exit 2; }

exec fedcluster app serve "$1" \
    --host "${FEDCLUSTER_REGISTRY_BIND:-127.0.0.1}" \
    --port "${FEDCLUSTER_REGISTRY_PORT:-9080}"
