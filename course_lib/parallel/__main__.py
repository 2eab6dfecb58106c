"""`torchrun --nproc-per-node N -m course_lib.parallel`: every rank shards the same model and runs one forward.

    torchrun --nproc-per-node 2 -m course_lib.parallel              # a small random model (4 heads), gloo
    torchrun --nproc-per-node 3 -m course_lib.parallel --smollm2    # the default model: 9 heads, 3 per rank

torchrun starts the processes and sets RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT; each rank builds the whole
model, keeps the unsharded logits, shards itself and runs the same prompt. Rank 0 prints how far the sharded
logits are from the unsharded ones and the bytes the collectives moved against the formula.
"""
from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist

from ..config import ModelConfig
from ..model import Transformer
from ..profiling.memory import weight_bytes
from .accounting import comm_per_token
from .shard import shard_model


def small_model(seed: int = 0) -> Transformer:
    """Random weights, the same on every rank (same seed): 4 query heads, 2 KV heads."""
    cfg = ModelConfig(vocab_size=1000, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                      num_kv_heads=2, max_position_embeddings=256)
    torch.manual_seed(seed)
    model = Transformer(cfg)
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.2)
    return model.eval()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smollm2", action="store_true", help="the default model (needs tp in 1, 3, 9)")
    args = ap.parse_args(argv)
    if "RANK" not in os.environ:
        raise SystemExit("run me under torchrun: torchrun --nproc-per-node 2 -m course_lib.parallel")
    cuda = torch.cuda.is_available()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo")
    if args.smollm2:
        from ..loading import load_model

        model = load_model(device=device, dtype=torch.float32)
    else:
        model = small_model().to(device)
    ids = torch.arange(3, 3 + 12, device=device)[None] % model.config.vocab_size  # [1, 12]
    with torch.inference_mode():
        want = model(ids)
        full = model.config
        shard_model(model, rank, world)
        got = model(ids)
    formula = comm_per_token(full, world, model.dtype)
    if rank == 0:
        print(f"{world} ranks ({dist.get_backend()}): max |sharded - unsharded| logit = "
              f"{(got - want).abs().max().item():.2e}")
        print(f"rank 0 holds {weight_bytes(model) / 2**20:.2f} MiB of weights, "
              f"{model.config.num_heads} query / {model.config.num_kv_heads} KV heads")
        n, comm = ids.numel(), model.comm
        print(f"all-reduce bytes: counted {comm.all_reduce_bytes}, formula {formula.all_reduce_bytes * n}; "
              f"all-gather bytes: counted {comm.all_gather_bytes}, formula {formula.all_gather_bytes * n}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
