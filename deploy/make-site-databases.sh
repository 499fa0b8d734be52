#!/usr/bin/env bash
# Make, on a running PostgreSQL server, one login role and one database per site, the
# database owned by its role, each with a fresh random password written to the invoking
# user's libpq password file ($PGPASSFILE, else ~/.pgpass; mode 0600), never into a URL:
# a site's URL is then postgresql+psycopg://NAME@HOST:PORT/NAME (docs/tutorials/omop-cohort.md).
#
# Usage: deploy/make-site-databases.sh [--host HOST] [--port PORT] NAME...
#   HOST, PORT: where the sites reach the server (the password file's lines); default
#   localhost 5432. NAME: a lower-case PostgreSQL name (letters, digits, _).
# The administrator's connection is ADMIN_PSQL: by default "sudo -u postgres psql", the
# server Debian's postgresql package installs and starts (peer authentication of the
# postgres OS user); for another server, e.g. ADMIN_PSQL="psql -h db.internal -U admin"
# with its password in PGPASSWORD. A role or database that exists already is an error:
# the script changes nothing it did not make.
set -euo pipefail

host=localhost
port=5432
while [ "$#" -gt 0 ]; do
    case $1 in
        --host) host=$2; shift 2 ;;
        --port) port=$2; shift 2 ;;
        --) shift; break ;;
        -*) echo "$0: unknown option $1" >&2; exit 2 ;;
        *) break ;;
    esac
done
if [ "$#" -lt 1 ]; then
    echo "usage: $0 [--host HOST] [--port PORT] NAME..." >&2
    exit 2
fi
read -ra admin <<< "${ADMIN_PSQL:-sudo -u postgres psql}"
passfile=${PGPASSFILE:-$HOME/.pgpass}

psql_admin() {  # SQL on stdin; NAME and PASSWORD as psql variables (quoted by psql)
    "${admin[@]}" -X -q -t -A -v ON_ERROR_STOP=1 -d postgres "$@"
}

for name in "$@"; do
    if ! [[ $name =~ ^[a-z_][a-z0-9_]{0,62}$ ]]; then
        echo "$0: $name: a site's role and database name is lower-case letters, digits and _" >&2
        exit 2
    fi
    found=$(psql_admin -v name="$name" <<'SQL'
SELECT (SELECT count(*) FROM pg_roles WHERE rolname = :'name')
     + (SELECT count(*) FROM pg_database WHERE datname = :'name');
SQL
)
    if [ "$found" != "0" ]; then
        echo "$0: a role or database named $name exists already on the server; nothing changed for it" >&2
        exit 1
    fi
done

touch "$passfile"
chmod 600 "$passfile"
for name in "$@"; do
    password=$(head -c 24 /dev/urandom | base64 | tr -d '/+=\n')
    psql_admin -v name="$name" -v password="$password" <<'SQL'
CREATE ROLE :"name" LOGIN PASSWORD :'password';
CREATE DATABASE :"name" OWNER :"name";
REVOKE ALL ON DATABASE :"name" FROM PUBLIC;
SQL
    # this host:port:database:user's line replaced, the others kept
    awk -v prefix="$host:$port:$name:$name:" 'index($0, prefix) != 1' "$passfile" > "$passfile.new"
    printf '%s:%s:%s:%s:%s\n' "$host" "$port" "$name" "$name" "$password" >> "$passfile.new"
    chmod 600 "$passfile.new"
    mv "$passfile.new" "$passfile"
    echo "site database $name: role $name, URL postgresql+psycopg://$name@$host:$port/$name (password in $passfile)"
done
