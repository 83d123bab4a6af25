#!/bin/sh
# Run once by Patroni on the member that initialises the cluster; $1 is a connection URL (the
# superuser's). Creates the nodes' role `chronoq`: it owns the database chronoq and nothing
# more (no superuser, no other database). Its password comes from the environment
# (CHRONOQ_DB_PASSWORD) through psql's \getenv, on stdin: never on a command line.
set -eu
: "${CHRONOQ_DB_PASSWORD:?set CHRONOQ_DB_PASSWORD}"
psql -v ON_ERROR_STOP=1 "$1" <<'SQL'
\getenv app_password CHRONOQ_DB_PASSWORD
CREATE ROLE chronoq LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS
  PASSWORD :'app_password';
CREATE DATABASE chronoq OWNER chronoq;
REVOKE ALL ON DATABASE chronoq FROM PUBLIC;
REVOKE ALL ON DATABASE postgres FROM PUBLIC;
REVOKE ALL ON DATABASE template1 FROM PUBLIC;
SQL
