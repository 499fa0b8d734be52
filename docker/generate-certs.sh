#!/usr/bin/env bash
# Credentials for docker/compose.tls.yml: a CA, the SuperLink's certificate for the
# compose service name "superlink" (plus any extra names in $SUPERLINK_NAMES, e.g. the
# host's public name for sites outside this machine), and keys for site-1..site-3, into
# docker/certs/. The private keys are made readable by the images' user (uid 49999).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
"$here/../deploy/make-credentials.sh" "$here/certs" "superlink${SUPERLINK_NAMES:+,$SUPERLINK_NAMES}" \
    site-1 site-2 site-3
chmod 0644 "$here/certs/server.key"
if [ "$(id -u)" = 0 ]; then
    chown 49999:49999 "$here/certs/server.key" "$here"/certs/sites/site-*
    chmod 0600 "$here/certs/server.key"
else
    chmod 0644 "$here"/certs/sites/site-?
    echo "note: not root, so the site keys are world-readable; on a real site only that" \
         "site's key exists on its machine" >&2
fi
# The sites' trusted-entities file (compose.tls.yml mounts it): made empty (`{}`: no list,
# any app runs) only if missing, and said so; list the reviewers' public keys in it to
# run signed apps only (docs/how-to/signed-apps.md).
if [ ! -e "$here/certs/trusted-entities.yaml" ]; then
    printf '%s\n' "# key id: OpenSSH Ed25519 public key of a reviewer whose signed apps the sites run" \
        "# (empty {}: no list, any app runs; docs/how-to/signed-apps.md)" "{}" \
        > "$here/certs/trusted-entities.yaml"
    echo "note: $here/certs/trusted-entities.yaml lists no key yet: the sites run any app" >&2
fi
