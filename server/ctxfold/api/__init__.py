"""gRPC transport: proto <-> domain conversion, error mapping, auth, the servicer."""
