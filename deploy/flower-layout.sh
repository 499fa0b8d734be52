# Sourced (POSIX sh) by the scripts that start Flower: where the installed Flower serves
# the sites' Fleet API. Flower 1.39 serves it over gRPC on a port of its own (9092 by
# default); 1.40 and later over HTTP on the SuperLink's --port (8000 by default), beside
# the Control API (docs/how-to/flower-versions.md).
# Sets FLOWER_VERSION (major.minor of `flwr --version`), FLEET_GRPC (1 under 1.39, else 0)
# and FLEET_PORT (FEDCLUSTER_FLEET_PORT, default 9092, under 1.39; FEDCLUSTER_CONTROL_PORT,
# default 8000, under 1.40+). A FLOWER_VERSION already set is taken as it is (the tests
# of docker/flower-entry.sh set it, to save a Flower start per call).
FLOWER_VERSION=${FLOWER_VERSION:-$(flwr --version 2>/dev/null | sed -n 's/^Flower version: \([0-9]*\.[0-9]*\).*/\1/p')}
if [ -z "$FLOWER_VERSION" ]; then
    echo "cannot tell the installed Flower's version (\`flwr --version\`): is flwr on PATH?" >&2
    exit 2
fi
case $FLOWER_VERSION in
    1.39) FLEET_GRPC=1; FLEET_PORT=${FEDCLUSTER_FLEET_PORT:-9092} ;;
    *) FLEET_GRPC=0; FLEET_PORT=${FEDCLUSTER_CONTROL_PORT:-8000} ;;
esac
