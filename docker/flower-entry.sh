#!/bin/sh
# The entry point of the superlink and supernode images: start the Flower executable given
# first with the Fleet API layout of the Flower release in the image (deploy/flower-layout.sh):
# - flower-superlink: under Flower 1.39, also the gRPC Fleet API on 0.0.0.0:9092;
# - flower-supernode: FEDCLUSTER_SUPERLINK (the coordinator's host, no port) becomes
#   --superlink HOST:9092 under 1.39 and HOST:8000 under 1.40 and later.
# Everything else is passed to the executable as it is. FEDCLUSTER_ENTRY_DRY_RUN=1 prints the
# command line instead of running it (tests/test_docker.py).
set -eu
executable=$1
shift
. "${FEDCLUSTER_LAYOUT:-/app/flower-layout.sh}"  # deploy/flower-layout.sh, copied in
case $executable in
    flower-superlink)
        if [ "$FLEET_GRPC" = 1 ]; then
            set -- --fleet-api-type grpc-rere --fleet-api-address "0.0.0.0:$FLEET_PORT" "$@"
        fi ;;
    flower-supernode)
        if [ -n "${FEDCLUSTER_SUPERLINK:-}" ]; then
            set -- --superlink "$FEDCLUSTER_SUPERLINK:$FLEET_PORT" "$@"
        fi ;;
    *) echo "flower-entry.sh: flower-superlink or flower-supernode, not '$executable'" >&2; exit 2 ;;
esac
if [ "${FEDCLUSTER_ENTRY_DRY_RUN:-}" = 1 ]; then
    echo "$executable $*"
    exit 0
fi
exec "$executable" "$@"
