#!/usr/bin/env bash
# The webhook's serving certificate without cert-manager: a CA of its own and a certificate for
# the Service's names, made with openssl; stored as the Secret llmmon-webhook-tls; this folder
# applied; the CA written into the caBundle of both webhook entries.
#
#   ./self-signed.sh              apply with kubectl's current context
#   ./self-signed.sh --out DIR    write secret.yaml, cabundle-patch.json and ca.crt into DIR,
#                                 apply nothing (review, or apply with your own tooling)
#
# DAYS (default 365) is how long both stay valid. Run it again before then: the webhook re-reads
# the renewed Secret without a restart once the kubelet has updated the mounted files (up to
# a minute or so); pods created in between may get no reporter (failurePolicy: Ignore).
set -euo pipefail

NAMESPACE=llmmon
SERVICE=llmmon-webhook
DAYS=${DAYS:-365}
here=$(cd "$(dirname "$0")" && pwd)
out=""
case "${1:-}" in
  --out) out=${2:?--out needs a directory}; mkdir -p "$out" ;;
  "") ;;
  *) echo "usage: $0 [--out DIR]" >&2; exit 2 ;;
esac
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

ssl() { openssl "$@" 2>"$work/openssl.log" || { cat "$work/openssl.log" >&2; exit 1; }; }
ssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days "$DAYS" \
  -keyout "$work/ca.key" -out "$work/ca.crt" -subj "/CN=llmmon-webhook-ca" \
  -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign"
ssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
  -keyout "$work/tls.key" -out "$work/tls.csr" -subj "/CN=$SERVICE.$NAMESPACE.svc"
printf 'subjectAltName=DNS:%s.%s.svc,DNS:%s.%s.svc.cluster.local\nextendedKeyUsage=serverAuth\n' \
  "$SERVICE" "$NAMESPACE" "$SERVICE" "$NAMESPACE" >"$work/ext"
ssl x509 -req -in "$work/tls.csr" -CA "$work/ca.crt" -CAkey "$work/ca.key" -CAcreateserial \
  -days "$DAYS" -out "$work/tls.crt" -extfile "$work/ext"

kubectl create secret tls llmmon-webhook-tls --namespace "$NAMESPACE" \
  --cert "$work/tls.crt" --key "$work/tls.key" --dry-run=client -o yaml >"$work/secret.yaml"
bundle=$(base64 -w0 <"$work/ca.crt")
printf '[{"op":"add","path":"/webhooks/%d/clientConfig/caBundle","value":"%s"},' 0 "$bundle" \
  >"$work/cabundle-patch.json"
printf '{"op":"add","path":"/webhooks/%d/clientConfig/caBundle","value":"%s"}]\n' 1 "$bundle" \
  >>"$work/cabundle-patch.json"

if [ -n "$out" ]; then
  cp "$work/secret.yaml" "$work/cabundle-patch.json" "$work/ca.crt" "$out/"
  exit 0
fi
kubectl apply -f "$work/secret.yaml"
kubectl apply -k "$here"
kubectl patch mutatingwebhookconfiguration "$SERVICE" --type=json \
  --patch-file "$work/cabundle-patch.json"
