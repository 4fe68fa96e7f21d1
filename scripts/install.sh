#!/usr/bin/env bash
# The one install script: the Dockerfile's build stage and .ci/run both run it, so the image and
# CI install the same things the same way.
#
#   scripts/install.sh          llmmon, the reporter it depends on (reporter/) and its runtime
#                               dependencies (pinned in pyproject.toml)
#   scripts/install.sh --test   instead, both editable, with the test extra; torch for the multi-process
#                               reporter tests; and, with apt-get, only what is missing of
#                               Debian's prometheus, prometheus-alertmanager, victoria-metrics
#                               (with vmagent and vmalert), openssl, systemd, iproute2 (ip:
#                               network namespaces), procps (sysctl) and chromium with a font
#                               (the pages' browser tests)
#
# Environment:
#   PYTHON           the interpreter (default python3); the Dockerfile points it at a venv
#   TORCH_SPEC       the torch requirement for --test (default torch==2.13.0), or a wheel
#                    file; set and empty: keep the torch that is installed
#   TORCH_INDEX_URL  the index torch comes from, e.g. https://download.pytorch.org/whl/cpu
#   PIP_INDEX_URL, PIP_FIND_LINKS ...   pip's own variables, honoured for every package
#
# Torch: on Linux x86_64, torch==2.13.0 from PyPI is the CUDA build, a ~526 MB wheel plus
# several GB of nvidia-* packages, even on a machine without a GPU. The tests need only the
# CPU build (torch-2.13.0+cpu, a ~190 MB wheel, no nvidia-* packages), which PyPI does not
# carry: take it from PyTorch's index (TORCH_INDEX_URL above) or a local wheel (TORCH_SPEC).
#
# The tests run as root (network namespaces, tmpfs mounts, unshare) and need ip and sysctl;
# kubectl (not in Debian's archive) for the manifest tests.
set -euo pipefail
cd "$(dirname "$0")/.."

python=${PYTHON:-python3}
torch=${TORCH_SPEC-torch==2.13.0}
test=0
for arg in "$@"; do
  case "$arg" in
    --test) test=1 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 0 ;;
    *) echo "install.sh: unknown argument $arg (use --test or nothing)" >&2; exit 2 ;;
  esac
done

pip=("$python" -m pip install --disable-pip-version-check --no-input)

if [ "$test" -eq 0 ]; then
  "${pip[@]}" ./reporter .
  exit 0
fi

missing=()
command -v promtool >/dev/null || missing+=(prometheus)
command -v prometheus-alertmanager >/dev/null || missing+=(prometheus-alertmanager)
command -v vmalert >/dev/null || missing+=(victoria-metrics)
command -v openssl >/dev/null || missing+=(openssl)
command -v systemd-analyze >/dev/null || missing+=(systemd)
command -v ip >/dev/null || missing+=(iproute2)
command -v sysctl >/dev/null || missing+=(procps)
command -v chromium >/dev/null || missing+=(chromium fonts-dejavu-core)
if [ "${#missing[@]}" -gt 0 ]; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
command -v kubectl >/dev/null || echo "install.sh: kubectl is not installed; the manifest" \
  "tests need it (it is not in Debian's archive: install it from your Kubernetes packages)" >&2
[ "$(id -u)" -eq 0 ] || echo "install.sh: the tests run as root (network namespaces, tmpfs" \
  "mounts, unshare); as $(id -un) they fail" >&2

# torch first and pinned: a bare `torch` requirement elsewhere would pull the newest build.
if [ -n "$torch" ]; then
  "${pip[@]}" ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} "$torch"
fi
"${pip[@]}" -e ./reporter -e '.[test]'
