#!/bin/sh
# The entrypoint of the podman platform's PostgreSQL image: the subset of the official image's docker-entrypoint.sh
# the manifests use. On an empty PGDATA it runs initdb as POSTGRES_USER with POSTGRES_PASSWORD (read from a file,
# never an argument) and POSTGRES_INITDB_ARGS, lets every host in with POSTGRES_HOST_AUTH_METHOD, and creates
# POSTGRES_DB through a server listening on its socket only; then it runs the command (postgres) as uid 999.
set -eu

if [ "$(id -u)" = 0 ]; then
    # Root only to own the data directory (a fresh volume is root's), then drop to postgres for good.
    mkdir -p "$PGDATA"
    chown 999:999 "$PGDATA"
    chmod 700 "$PGDATA"
    exec setpriv --reuid=999 --regid=999 --clear-groups "$0" "$@"
fi

if [ "${1:-}" = postgres ] && [ ! -s "$PGDATA/PG_VERSION" ]; then
    : "${POSTGRES_PASSWORD:?is required: the image never starts a server without a password}"
    user="${POSTGRES_USER:-postgres}"
    pwfile="$(mktemp)"
    printf '%s' "$POSTGRES_PASSWORD" > "$pwfile"
    # shellcheck disable=SC2086 # POSTGRES_INITDB_ARGS is a list of options, as in the official image
    initdb -D "$PGDATA" -U "$user" --pwfile="$pwfile" ${POSTGRES_INITDB_ARGS:-}
    rm -f "$pwfile"
    printf '\nhost all all all %s\n' "${POSTGRES_HOST_AUTH_METHOD:-scram-sha-256}" >> "$PGDATA/pg_hba.conf"
    socket="$(mktemp -d)"
    pg_ctl -D "$PGDATA" -w -o "-c listen_addresses='' -c unix_socket_directories=$socket" start
    db="${POSTGRES_DB:-$user}"
    if [ "$db" != postgres ]; then
        # the name is passed as a psql variable and quoted by psql (:"db"), never pasted into the SQL
        # (psql interpolates variables in what it reads, not in -c)
        echo 'CREATE DATABASE :"db";' | PGPASSWORD="$POSTGRES_PASSWORD" psql -h "$socket" -U "$user" -d postgres \
            -v ON_ERROR_STOP=1 -v db="$db" -q
    fi
    pg_ctl -D "$PGDATA" -w -m fast stop
    rmdir "$socket"
fi

if [ "${1:-}" = postgres ]; then
    shift
    exec postgres -D "$PGDATA" -c listen_addresses='*' -c unix_socket_directories=/tmp "$@"
fi
exec "$@"
