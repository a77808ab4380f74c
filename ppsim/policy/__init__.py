"""The pure policy module: scheduling, KV blocks and pipeline engine-core loops.

Nothing here imports simpy, torch, time or random, nor reads a clock: the simulator and the live
engine both execute the decisions made here (see DESIGN.md).
"""
