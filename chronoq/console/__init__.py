"""``chronoq console``: the operator's web console over the gRPC API of a running cluster.

It holds no credentials of its own: every call goes through the client SDK with the operator's
bearer token, so the console can never do more than that token may.
"""
