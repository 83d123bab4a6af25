#!/bin/sh
# Run once by the postgres image's entrypoint when store shard postgres-shard-1 is initialised
# (its temporary server, as the superuser). Creates the nodes' role `chronoq`: it owns the
# database chronoq and nothing more (no superuser, no other database). Its password comes from
# the environment (CHRONOQ_DB_PASSWORD, this shard's own) through psql's \getenv, on stdin:
# never on a command line.
set -eu
: "${CHRONOQ_DB_PASSWORD:?set CHRONOQ_DB_PASSWORD}"
psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname postgres <<'SQL'
\getenv app_password CHRONOQ_DB_PASSWORD
CREATE ROLE chronoq LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS
  PASSWORD :'app_password';
CREATE DATABASE chronoq OWNER chronoq;
REVOKE ALL ON DATABASE chronoq FROM PUBLIC;
REVOKE ALL ON DATABASE postgres FROM PUBLIC;
REVOKE ALL ON DATABASE template1 FROM PUBLIC;
SQL
