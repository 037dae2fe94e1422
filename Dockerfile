# syntax=docker/dockerfile:1
# vwserver's container image: the package and its *runtime* dependencies, exactly as locked in
# requirements-runtime.lock (`make lock` writes it; dev tools such as pytest never get in), in a
# virtualenv without pip, run as a numeric non-root user. Everything is compiled to bytecode at
# build time and PYTHONDONTWRITEBYTECODE is set, so the container runs with a read-only root
# filesystem (the Deployment in manifests/deploy/ mounts only an in-memory /tmp).
#
# Base image: pinned by tag and by the digest of its multi-platform index as recorded by
# docker-library/repo-info (not verified by pulling). Refresh both together with
#   docker buildx imagetools inspect python:3.11.<patch>-slim-trixie
ARG PYTHON_IMAGE=python:3.11.16-slim-trixie@sha256:be1575ed968de893bd54f4c56315ff7c4736ce522c1bca08fd521731aafc0d76

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore
# Where the network to PyPI goes through a TLS-inspecting proxy, pip must trust that proxy's CA:
# give the CA bundle as a build secret and point pip at it, e.g. (what `make image` does)
#   --secret id=pip-ca,src=/etc/ssl/certs/ca-certificates.crt
#   --build-arg PIP_CERT=/run/secrets/pip-ca
# A secret is mounted for the one RUN only and never stored in a layer; the build arg lives in
# this build stage alone, which is not shipped. Without them pip uses its own CA bundle.
ARG PIP_CERT
# The base image's pip installs into a virtualenv that has no pip of its own.
RUN python -m venv --without-pip /opt/vwserver
COPY requirements-runtime.lock /src/requirements-runtime.lock
RUN --mount=type=secret,id=pip-ca \
    python -m pip --python /opt/vwserver/bin/python install --no-deps --only-binary=:all: \
        -r /src/requirements-runtime.lock
COPY pyproject.toml README.md /src/
COPY vwserver /src/vwserver
# --no-deps: the lock above is the complete dependency set, and `pip check` proves it.
# (pip fetches the build backend from PyPI: the same CA bundle.)
RUN --mount=type=secret,id=pip-ca \
    python -m pip --python /opt/vwserver/bin/python install --no-deps /src \
    && python -m pip --python /opt/vwserver/bin/python check

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="vwserver" \
      org.opencontainers.image.description="Filtered APIExport virtual workspaces for kcp"
ENV PATH=/opt/vwserver/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
COPY --from=build /opt/vwserver /opt/vwserver
USER 65532:65532
EXPOSE 8443
ENTRYPOINT ["vwserver"]
CMD ["serve", "--config", "/etc/vwserver/config/config.yaml"]
