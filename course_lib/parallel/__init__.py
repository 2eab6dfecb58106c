"""Tensor parallelism on torch.distributed: shard the Transformer across ranks, run one process per rank.

    from course_lib.parallel import shard_model
    shard_model(model, rank, world_size)      # in place; then every rank runs the same forward
    LLM(tensor_parallel_size=3)               # rank 0 here, ranks 1..2 spawned (gloo on the CPU, NCCL on CUDA)
    torchrun --nproc-per-node 3 -m course_lib.parallel   # the same split, every rank launched by torchrun
"""
from ..profiling.memory import weight_bytes
from .accounting import comm_per_token, rank_weight_bytes
from .layers import CommStats, RowParallelLinear, VocabParallelEmbedding, VocabParallelLMHead
from .links import LINKS, Link, all_reduce_seconds, measure_all_reduce, ring_all_reduce_seconds
from .shard import TPShard, plan_shard, rank_config, shard_model
from .workers import TensorParallelWorkers

__all__ = ["CommStats", "LINKS", "Link", "RowParallelLinear", "TPShard", "TensorParallelWorkers",
           "VocabParallelEmbedding", "VocabParallelLMHead", "all_reduce_seconds", "comm_per_token", "measure_all_reduce", "plan_shard",
           "rank_config", "rank_weight_bytes", "ring_all_reduce_seconds", "shard_model", "weight_bytes"]
