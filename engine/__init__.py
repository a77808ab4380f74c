"""A real pipeline-parallel inference engine, scheduled by ``ppsim.policy``.

One process per pipeline stage (forked from a torch-loaded fork server), hidden states + residual sent
between stages with ``torch.distributed`` point-to-point ops (gloo on CPU, nccl on GPUs), a paged
KV cache per stage, greedy sampling on the last stage. The engine core runs in the launching
(driver) process, as vLLM's ``EngineCore`` runs apart from its workers, and drives the *same*
engine-core generator as the simulator (``ppsim.policy.pipelines.build_core``): engine/ holds no
scheduling logic.

Entry point: :func:`engine.run.run_engine`.
"""
