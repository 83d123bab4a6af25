#!/bin/sh
# Run once by Patroni on the member that initialises the cluster; $1 is a connection URL.
set -eu
psql -v ON_ERROR_STOP=1 "$1" -c "CREATE DATABASE chronoq"
