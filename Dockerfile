# llmmon node exporter image.
#
# Build stage: Debian 12's Python 3.11 makes a venv in /opt/llmmon and runs scripts/install.sh,
# the same script .ci/run runs. Runtime stage: distroless python3-debian12, the same Debian 12
# Python 3.11 at the same path (/usr/bin/python3.11), so the venv runs unchanged; it has no shell,
# no package manager and no compiler. The image runs as a numeric non-root user and writes nothing
# at run time (bytecode is compiled at build time), so a read-only root filesystem works.
#
# Pin by digest for releases: docker build --build-arg BUILD_IMAGE=debian:12.12-slim@sha256:...
#   --build-arg RUNTIME_IMAGE=gcr.io/distroless/python3-debian12:nonroot@sha256:...
ARG BUILD_IMAGE=debian:12.12-slim
ARG RUNTIME_IMAGE=gcr.io/distroless/python3-debian12:nonroot

FROM ${BUILD_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 DEBIAN_FRONTEND=noninteractive
RUN apt-get update -qq \
 && apt-get install -y -qq --no-install-recommends python3.11 python3.11-venv \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml README.md ./
COPY exporter ./exporter
COPY reporter ./reporter
COPY scripts/install.sh ./scripts/install.sh
RUN python3.11 -m venv /opt/llmmon \
 && PYTHON=/opt/llmmon/bin/python scripts/install.sh \
 && /opt/llmmon/bin/python -m pip uninstall -y -q pip \
 && /opt/llmmon/bin/python -m compileall -q -j 0 /opt/llmmon

FROM ${RUNTIME_IMAGE}
COPY --from=build /opt/llmmon /opt/llmmon
# NVML comes from the host driver: the NVIDIA container runtime mounts libnvidia-ml.so.1 into
# the multiarch library folder; listing it keeps dlopen working without an ld.so.cache update.
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu:/usr/lib/aarch64-linux-gnu \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=utility
USER 65534:65534
EXPOSE 9476
ENTRYPOINT ["/opt/llmmon/bin/llmmon"]
CMD ["serve"]
