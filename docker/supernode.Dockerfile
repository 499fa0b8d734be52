# One site's SuperNode (its ClientApps run in the superexec image next to it, which is
# where the site's data is mounted).
FROM flwr/supernode:1.39.0

WORKDIR /app
# No telemetry to flower.ai from a site or the coordinator (Flower sends it by default).
ENV FLWR_TELEMETRY_ENABLED=0
EXPOSE 9094
ENTRYPOINT ["flower-supernode"]
