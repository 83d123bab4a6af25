"""Real PostgreSQL and etcd servers run from pip-installed binaries, for development and tests."""

from chronoq.forking import disable_grpc_fork_handlers

# Whatever starts these servers imports this package; where it does so before grpc is loaded
# (the test fixtures, for one), gRPC's fork handlers stay off: see chronoq.forking.
disable_grpc_fork_handlers()
