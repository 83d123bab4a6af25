"""Real PostgreSQL and etcd servers run from pip-installed binaries, for development and tests."""
