#!/usr/bin/env bash
# Sign an app bundle (FAB, from `flwr build`) for the sites that run only signed apps, and
# add FAB and signature to the coordinator's app registry (a directory; serve it with
# deploy/serve-apps.sh). Run by the app's reviewer, where the reviewer's private key is.
# Prints the line each site adds to its trusted-entities file (docs/how-to/signed-apps.md).
#
# Usage: deploy/sign-app.sh FAB PRIVATE_KEY KEY_ID REGISTRY_DIR
#   PRIVATE_KEY  the reviewer's Ed25519 key, OpenSSH format (ssh-keygen -t ed25519)
#   KEY_ID       the name the sites list the public key under (e.g. fedcluster-reviewers)
set -euo pipefail

if [ "$#" -ne 4 ]; then
    echo "usage: $0 FAB PRIVATE_KEY KEY_ID REGISTRY_DIR" >&2
    exit 2
fi
for file in "$1" "$2"; do
    [ -r "$file" ] || { echo "$file is not readable" >&2; exit 2; }
done

exec fedcluster app sign "$1" --key "$2" --key-id "$3" --registry "$4"
