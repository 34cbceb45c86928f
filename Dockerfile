# The verl-operator image: the operator (`verl-operator run`) and the self-contained launcher that Ray pods
# of an unmodified verl image copy (`verl.launcher: inject`).
#
#   docker build -t ghcr.io/verl-operator/verl-operator:0.1.0 .
#
# BASE is any Debian bookworm image (the default is pinned by its dated tag). Without a container engine,
# `verl-operator-dev devcluster image` (the development tooling in tools/, not part of this image) builds the
# same image from Debian packages (mmdebstrap) and can give that base to this file: `--build-arg BASE=<...>`.
ARG BASE=debian:bookworm-20250520-slim

FROM ${BASE} AS build
# Debian's Python 3.11 and venv; skipped when the base already has them (the mmdebstrap-built base).
RUN if ! python3 -c 'import ensurepip' 2>/dev/null; then \
      apt-get update && apt-get install -y --no-install-recommends python3 python3-venv ca-certificates \
      && rm -rf /var/lib/apt/lists/*; \
    fi
RUN python3 -m venv /opt/verl-operator
COPY pyproject.toml README.md /src/
COPY operator /src/operator
COPY launcher /src/launcher
# The launcher zipapp is written by the same function as the engine-less build (same bytes).
RUN /opt/verl-operator/bin/pip install --no-cache-dir --no-compile /src \
    && /opt/verl-operator/bin/python -c "import pathlib, verl_launcher; \
from verl_operator.launcher_zipapp import launcher_zipapp; \
from verl_operator.manifests.launchspec import LAUNCHER_IN_OPERATOR_IMAGE as out; \
pathlib.Path(out).parent.mkdir(parents=True, exist_ok=True); \
pathlib.Path(out).write_bytes(launcher_zipapp(pathlib.Path(verl_launcher.__file__).parent))" \
    && /opt/verl-operator/bin/pip uninstall -y -q pip

FROM ${BASE}
RUN if ! command -v python3 >/dev/null; then \
      apt-get update && apt-get install -y --no-install-recommends python3 ca-certificates \
      && rm -rf /var/lib/apt/lists/*; \
    fi
COPY --from=build /opt/verl-operator /opt/verl-operator
RUN echo 'nonroot:x:65532:65532:nonroot:/tmp:/usr/sbin/nologin' >> /etc/passwd \
    && echo 'nonroot:x:65532:' >> /etc/group
ENV PATH=/opt/verl-operator/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    HOME=/tmp \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
LABEL org.opencontainers.image.title=verl-operator
# Non-root (the chart's securityContext uses the same ids).
USER 65532:65532
ENTRYPOINT ["verl-operator", "run"]
