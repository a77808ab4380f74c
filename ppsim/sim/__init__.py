"""The SimPy executor: stage and link processes, the engine-core process, the client."""
