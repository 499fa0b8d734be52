# The federation's SuperLink (the ServerApp runs in the superexec image). It keeps its
# state (registered sites, runs) in /app/state, a volume, so sites keep their node ids
# across restarts.
FROM flwr/superlink:1.39.0

WORKDIR /app
# No telemetry to flower.ai from a site or the coordinator (Flower sends it by default).
ENV FLWR_TELEMETRY_ENABLED=0
RUN mkdir -p /app/state
VOLUME ["/app/state"]
EXPOSE 8000 9092
ENTRYPOINT ["flower-superlink"]
