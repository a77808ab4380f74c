"""Calibration: measure a model's operators, the link and the engine's CPU overheads with torch, fit
per-operator time models once, and write a versioned artifact that :mod:`ppsim.cost.profiled` loads.

- :mod:`calibration.layer`: the Llama decoder layer as separately callable operators (torch).
- :mod:`calibration.timer`: CPU (perf_counter) and CUDA (events + synchronize) timing with repeats.
- :mod:`calibration.profile_ops`: the shape grid and the timed tasks, incl. whole-layer and held-out ones.
- :mod:`calibration.cpu_overheads`, :mod:`calibration.link`: scheduler CPU per step; gloo/NCCL ping-pong.
- :mod:`calibration.fit`: physics-shaped fits with leave-one-out error (numpy/scipy).
- :mod:`calibration.calibrate`: the ``ppsim calibrate`` pipeline; :mod:`calibration.artifact`: writing.
- :mod:`calibration.vidur_import`: Vidur's published GPU profiles -> a ppsim artifact.

Only this package (and ``engine/``) imports torch; the simulator reads artifacts without it.
"""
