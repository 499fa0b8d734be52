# One site's SuperNode (its ClientApps run in the superexec image next to it, which is
# where the site's data is mounted). FLWR_VERSION: the coordinator's Flower release (a
# 1.40+ SuperNode cannot join a 1.39 SuperLink); the entry point connects to
# FEDCLUSTER_SUPERLINK on that release's Fleet API port (docker/flower-entry.sh).
ARG FLWR_VERSION=1.42.0
FROM flwr/supernode:${FLWR_VERSION}

WORKDIR /app
# No telemetry to flower.ai from a site or the coordinator (Flower sends it by default).
ENV FLWR_TELEMETRY_ENABLED=0
COPY deploy/flower-layout.sh docker/flower-entry.sh /app/
EXPOSE 9094
ENTRYPOINT ["/bin/sh", "/app/flower-entry.sh", "flower-supernode"]
