"""The Worker gRPC service over the engine; ``services.prefill`` and ``services.decode`` run it in their role."""
