#!/usr/bin/env bash
# Make the TLS material deploy/k8s/pdmesh.yaml (and the Helm chart with tls.enabled) mounts:
# a private CA, and one certificate it signs whose names cover what pdmesh's processes
# dial inside the cluster (*.prefill, *.decode, kvstore, router, the probes' 127.0.0.1).
# Then the Secret: applied to the current kubectl context, or written as a manifest.
#
#   bash deploy/k8s/make-tls-secret.sh                    # creates Secret pdmesh-tls with kubectl
#   bash deploy/k8s/make-tls-secret.sh --out DIR          # only the files, and DIR/secret.yaml
#   options: --name SECRET (pdmesh-tls) --namespace NS --days N (365) --extra-san DNS:router.example.com
#
# A CA of your own (cert-manager, a corporate CA) is better for production: put its
# ca.crt and a certificate with the same names in the Secret instead.
set -euo pipefail
name=pdmesh-tls namespace="" days=365 out="" extra=""
while [ $# -gt 0 ]; do
  case "$1" in
    --name) name=$2; shift 2 ;;
    --namespace) namespace=$2; shift 2 ;;
    --days) days=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --extra-san) extra="$extra,$2"; shift 2 ;;
    *) echo "make-tls-secret.sh: unknown option $1 (see the comment at the top)" >&2; exit 2 ;;
  esac
done
dir=${out:-$(mktemp -d)}
mkdir -p "$dir"
sans="DNS:*.prefill,DNS:*.decode,DNS:kvstore,DNS:router,DNS:redis,DNS:localhost,IP:127.0.0.1$extra"
openssl req -x509 -newkey rsa:3072 -nodes -days "$days" -subj "/CN=pdmesh CA" \
  -keyout "$dir/ca.key" -out "$dir/ca.crt" -addext "basicConstraints=critical,CA:TRUE" \
  -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
openssl req -newkey rsa:3072 -nodes -subj "/CN=pdmesh" -keyout "$dir/tls.key" -out "$dir/tls.csr" 2>/dev/null
printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth,clientAuth\nbasicConstraints=CA:FALSE\n' "$sans" > "$dir/ext.cnf"
openssl x509 -req -in "$dir/tls.csr" -CA "$dir/ca.crt" -CAkey "$dir/ca.key" -CAcreateserial -days "$days" \
  -extfile "$dir/ext.cnf" -out "$dir/tls.crt" 2>/dev/null
rm -f "$dir/tls.csr" "$dir/ext.cnf" "$dir/ca.srl"
ns=${namespace:+--namespace "$namespace"}
b64() { base64 < "$1" | tr -d '\n'; }
cat > "$dir/secret.yaml" <<YAML
apiVersion: v1
kind: Secret
metadata: {name: $name${namespace:+, namespace: $namespace}}
type: Opaque
data:
  tls.crt: $(b64 "$dir/tls.crt")
  tls.key: $(b64 "$dir/tls.key")
  ca.crt: $(b64 "$dir/ca.crt")
YAML
if [ -n "$out" ]; then
  echo "wrote $dir/{ca.crt,ca.key,tls.crt,tls.key,secret.yaml} (names: $sans); apply with: kubectl apply -f $dir/secret.yaml"
else
  # shellcheck disable=SC2086
  kubectl $ns apply -f "$dir/secret.yaml"
  echo "created Secret $name (names: $sans); the CA's key stays in $dir/ca.key"
fi
