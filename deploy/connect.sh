#!/usr/bin/env bash
# Add a TLS connection to a SuperLink to the operator's Flower config
# ($FLWR_HOME/config.toml, default ~/.flwr), for flwr run / ls / supernode register.
#
# Usage: deploy/connect.sh NAME HOST:CONTROL_PORT CA_CERT
set -euo pipefail

if [ "$#" -ne 3 ]; then
    echo "usage: $0 NAME HOST:CONTROL_PORT CA_CERT" >&2
    exit 2
fi
home=${FLWR_HOME:-$HOME/.flwr}
ca=$(cd "$(dirname "$3")" && pwd)/$(basename "$3")
[ -r "$ca" ] || { echo "CA certificate $3 is not readable" >&2; exit 2; }
mkdir -p "$home"
config="$home/config.toml"
if [ ! -f "$config" ] || ! grep -q '^\[superlink\]' "$config"; then
    printf '[superlink]\ndefault = "%s"\n\n' "$1" >> "$config"
fi
if grep -q "^\[superlink\.$1\]" "$config"; then
    echo "connection '$1' already in $config" >&2
    exit 1
fi
printf '[superlink.%s]\naddress = "%s"\nroot-certificates = "%s"\n\n' "$1" "$2" "$ca" >> "$config"
echo "added connection '$1' -> $2 to $config"
