# The federation's SuperLink (the ServerApp runs in the superexec image). It keeps its
# state (registered sites, runs) in /app/state, a volume, so sites keep their node ids
# across restarts. FLWR_VERSION: a Flower release fedcluster supports (1.39.0 to 1.42.0);
# the entry point adds the gRPC Fleet API's flags under 1.39 (docker/flower-entry.sh).
ARG FLWR_VERSION=1.42.0
FROM flwr/superlink:${FLWR_VERSION}

WORKDIR /app
# No telemetry to flower.ai from a site or the coordinator (Flower sends it by default).
ENV FLWR_TELEMETRY_ENABLED=0
COPY deploy/flower-layout.sh docker/flower-entry.sh /app/
RUN mkdir -p /app/state
VOLUME ["/app/state"]
# 8000: the Control API, and under Flower 1.40+ the sites' Fleet API (HTTP);
# 9092: the sites' gRPC Fleet API under Flower 1.39
EXPOSE 8000 9092
ENTRYPOINT ["/bin/sh", "/app/flower-entry.sh", "flower-superlink"]
