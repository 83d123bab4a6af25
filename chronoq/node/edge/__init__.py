"""The gRPC edge of a node: its servicers, the auth interceptor, the guard against
malformed requests and the one table of error codes. It imports dispatch, never the owner
engine (import contract ``node-layers``)."""
