#!/usr/bin/env bash
# Make the credentials of a fedcluster federation:
#   - a certificate authority (ca.crt, ca.key: keep ca.key offline),
#   - the SuperLink's TLS certificate (server.pem, server.key) for the names and
#     addresses the sites use to reach it,
#   - one EC P-384 key pair per site (sites/<site-id>, sites/<site-id>.pub) for SuperNode
#     authentication: the private key stays at the site, the .pub goes to the SuperLink's
#     operator, who registers it (register-site.sh).
#
# Usage: deploy/make-credentials.sh OUT_DIR SUPERLINK_NAMES SITE_ID...
#   SUPERLINK_NAMES: comma-separated host names and IP addresses of the SuperLink,
#   e.g. "superlink.example.org,10.0.0.5". localhost and 127.0.0.1 are always added: the
#   SuperLink's own SuperExec (which runs the ServerApp) connects to it on loopback.
# Needs openssl and ssh-keygen (Flower reads the site keys in OpenSSH format).
set -euo pipefail

if [ "$#" -lt 3 ]; then
    echo "usage: $0 OUT_DIR SUPERLINK_NAMES SITE_ID..." >&2
    exit 2
fi
out=$1
names=$2
shift 2

san=""
IFS=',' read -ra entries <<< "localhost,127.0.0.1,$names"
for entry in "${entries[@]}"; do
    if [[ $entry =~ ^[0-9.]+$ || $entry == *:* ]]; then
        san="${san:+$san,}IP:$entry"
    else
        san="${san:+$san,}DNS:$entry"
    fi
done

mkdir -p "$out/sites"
umask 077
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:secp384r1 -nodes -sha384 -days 825 \
    -subj "/CN=fedcluster federation CA" -keyout "$out/ca.key" -out "$out/ca.crt" 2>/dev/null
openssl req -newkey ec -pkeyopt ec_paramgen_curve:secp384r1 -nodes -sha384 \
    -subj "/CN=fedcluster SuperLink" -keyout "$out/server.key" -out "$out/server.csr" 2>/dev/null
printf 'subjectAltName=%s\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n' \
    "$san" > "$out/server.ext"
openssl x509 -req -in "$out/server.csr" -CA "$out/ca.crt" -CAkey "$out/ca.key" \
    -CAcreateserial -days 825 -sha384 -extfile "$out/server.ext" -out "$out/server.pem" 2>/dev/null
rm -f "$out/server.csr" "$out/server.ext" "$out/ca.srl"
chmod 644 "$out/ca.crt" "$out/server.pem"

for site in "$@"; do
    if [[ ! $site =~ ^[A-Za-z0-9_.-]+$ ]]; then
        echo "site id '$site': use letters, digits, '.', '_' or '-'" >&2
        exit 2
    fi
    rm -f "$out/sites/$site" "$out/sites/$site.pub"
    ssh-keygen -q -t ecdsa -b 384 -N "" -C "fedcluster site $site" -f "$out/sites/$site"
done
echo "credentials in $out: ca.crt, server.pem/server.key (for $san), sites/<id>[.pub] for: $*"
