#!/usr/bin/env bash
# The one install script: the Dockerfile's build stage and .ci/run both run it, so the image and
# CI install the same things the same way.
#
#   scripts/install.sh          llmmon and its runtime dependencies (pinned in pyproject.toml)
#   scripts/install.sh --test   also, editable, the test extra; torch 2.13.0 (CPU) for the
#                               multi-process reporter tests; and Debian's prometheus,
#                               prometheus-alertmanager, victoria-metrics (with vmagent and
#                               vmalert), openssl and systemd for the real-binary tests
#                               (apt-get, only for what is missing)
#
# PYTHON selects the interpreter (default python3); the Dockerfile points it at a venv.
set -euo pipefail
cd "$(dirname "$0")/.."

python=${PYTHON:-python3}
test=0
for arg in "$@"; do
  case "$arg" in
    --test) test=1 ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) echo "install.sh: unknown argument $arg (use --test or nothing)" >&2; exit 2 ;;
  esac
done

pip=("$python" -m pip install --disable-pip-version-check --no-input)

if [ "$test" -eq 0 ]; then
  "${pip[@]}" .
  exit 0
fi

missing=()
command -v promtool >/dev/null || missing+=(prometheus)
command -v prometheus-alertmanager >/dev/null || missing+=(prometheus-alertmanager)
command -v vmalert >/dev/null || missing+=(victoria-metrics)
command -v openssl >/dev/null || missing+=(openssl)
command -v systemd-analyze >/dev/null || missing+=(systemd)
if [ "${#missing[@]}" -gt 0 ]; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
command -v kubectl >/dev/null || echo "install.sh: kubectl is not installed; the manifest" \
  "tests need it (it is not in Debian's archive: install it from your Kubernetes packages)" >&2

# torch first and pinned: a bare `torch` requirement elsewhere would pull a multi-GB CUDA build.
"${pip[@]}" torch==2.13.0
"${pip[@]}" -e '.[test]'
