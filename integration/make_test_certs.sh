#!/usr/bin/env bash
# Test certificates, made fresh by the tests with the openssl command-line tool:
#   ca.pem            the CA that signs the server and the clients
#   server.pem/.key   CN=localhost, SAN DNS:localhost, IP:127.0.0.1
#   alice.pem/.key    client certificate, CN=alice (a principal under mutual TLS)
#   bob.pem/.key      client certificate, CN=bob
#   carol.pem/.key    client certificate as a mesh issues it: CN=workload-7, SANs
#                     URI:spiffe://cluster.local/ns/prod/sa/carol and DNS:carol.prod.svc
#   rogue-ca.pem      another CA; mallory.pem/.key is CN=alice signed by it
# Usage: integration/make_test_certs.sh DIR
set -euo pipefail
dir=$1
mkdir -p "$dir"
cd "$dir"
quiet() { "$@" >/dev/null 2>&1 || { echo "failed: $*" >&2; "$@"; exit 1; }; }

ca() {  # name subject
  quiet openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=$2" \
    -keyout "$1.key" -out "$1.pem" -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign
}
leaf() {  # name subject ca extensions
  quiet openssl req -newkey rsa:2048 -nodes -subj "/CN=$2" -keyout "$1.key" -out "$1.csr"
  printf '%s\n' "$4" > "$1.ext"
  quiet openssl x509 -req -in "$1.csr" -CA "$3.pem" -CAkey "$3.key" -CAcreateserial -days 2 -out "$1.pem" -extfile "$1.ext"
  rm -f "$1.csr" "$1.ext"
}

ca ca "threadwire test CA"
ca rogue-ca "someone else's CA"
leaf server localhost ca "subjectAltName=DNS:localhost,IP:127.0.0.1
extendedKeyUsage=serverAuth"
leaf alice alice ca "extendedKeyUsage=clientAuth"
leaf bob bob ca "extendedKeyUsage=clientAuth"
leaf carol workload-7 ca "subjectAltName=URI:spiffe://cluster.local/ns/prod/sa/carol,DNS:carol.prod.svc
extendedKeyUsage=clientAuth"
leaf mallory alice rogue-ca "extendedKeyUsage=clientAuth"
chmod 600 ./*.key
