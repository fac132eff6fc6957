# netopt container image: the agent, the coordinator and every CLI command.
#   docker build -t netopt:0.x .            (or: podman build / buildah bud)
#   docker run --rm netopt:0.x --version
# Two stages: the first builds netopt's wheel and every dependency's wheel (a
# compiler is there in case a dependency has no wheel for this platform); the
# final stage installs only those wheels, with iperf3 and iproute2, and runs as
# an unprivileged user. No compiler, no pip cache, no build tree in the final image.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
RUN apt-get update -qq \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends build-essential \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml README.md LICENSE ./
COPY netopt ./netopt
RUN python -m pip wheel --no-cache-dir --wheel-dir /wheels ".[postgres]"

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="netopt" \
      org.opencontainers.image.description="Cross-region network and transfer optimizer for distributed training" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN apt-get update -qq \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends iperf3 iproute2 \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --user-group --home-dir /var/lib/netopt --create-home \
      --shell /usr/sbin/nologin netopt \
 && install -d -o netopt -g netopt -m 0750 /var/cache/netopt /etc/netopt
COPY --from=build /wheels /tmp/wheels
RUN python -m pip install --no-cache-dir --no-index --find-links /tmp/wheels "netopt[postgres]" \
 && rm -rf /tmp/wheels
USER 10001:10001
ENV XDG_CACHE_HOME=/var/cache \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# 7460: coordinator; 7470/tcp: agent data plane, /metrics, /healthz; 7471/udp+tcp: probes.
EXPOSE 7460 7470 7471/udp 7471
ENTRYPOINT ["netopt"]
CMD ["--help"]
