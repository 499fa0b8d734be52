# The image that runs fedcluster's code: the ServerApp (next to the SuperLink) and each
# site's ClientApps (next to its SuperNode), as Flower SuperExec processes.
# Build from the repository root: docker build -f docker/superexec.Dockerfile -t fedcluster-superexec .
# FLWR_VERSION: the same Flower release as the SuperLink's and the SuperNodes' images.
ARG FLWR_VERSION=1.42.0
FROM flwr/superexec:${FLWR_VERSION}

WORKDIR /app
COPY --chown=app:app docker/requirements.txt /app/requirements.txt
RUN python -m pip install --no-cache-dir -r /app/requirements.txt

COPY --chown=app:app pyproject.toml README.md /app/src/
COPY --chown=app:app fedcluster /app/src/fedcluster
RUN python -m pip install --no-cache-dir --no-deps /app/src

# Numba's compiled kernels and the sites' parsed-data cache must be writable by the
# image's user (app); every message starts a fresh ClientApp process, which would
# otherwise compile the kernels again (the cache folder is named by the kernels' source,
# so a new app version with unchanged kernels loads them too). No telemetry to flower.ai.
ENV NUMBA_CACHE_DIR=/app/cache/numba \
    FLWR_TELEMETRY_ENABLED=0 \
    FEDCLUSTER_CACHE_DIR=/app/cache/data \
    MPLCONFIGDIR=/app/cache/matplotlib
RUN mkdir -p /app/cache/numba /app/cache/data /app/cache/matplotlib /app/outputs

ENTRYPOINT ["flower-superexec"]
