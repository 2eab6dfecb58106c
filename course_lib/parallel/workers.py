"""One process per rank, as nano-vllm and vLLM run them: rank 0 (the caller) schedules, the others follow.

    rank 0 (caller's process)                         ranks 1..N-1 (spawned)
    LLMEngine: schedule -> ModelRunner -> model(...)   loop: step = broadcast from rank 0
      model.forward: broadcast the step's inputs  -->         model(step inputs, own KV cache)
                     run its own shard        <== all-reduce / all-gather ==>  run its own shard
      sample (rank 0 only)

The engine is unchanged: on rank 0 the sharded model's `forward` first sends its inputs (ids, positions, the
paged-attention metadata) to the workers over a gloo group, then runs its shard, whose layers issue the
collectives. Every rank's KV cache holds only its own KV heads, with the same block ids. A worker that dies
turns the next step into a RuntimeError naming it (its sockets close, or its exit is seen before the step).
"""
from __future__ import annotations

import atexit
import os
import signal
import time
import weakref
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ..attention.paged import PagedAttention, PagedKVCache
from ..config import ModelConfig
from ..engine.config import EngineConfig
from ..host import free_port
from ..model import Transformer
from ..profiling.memory import weight_bytes
from .shard import plan_shard, shard_model

IDLE = timedelta(days=365)  # workers wait for the next step on the control group as long as rank 0 lives


def _device_for(device: torch.device, rank: int) -> torch.device:
    return torch.device("cuda", rank) if device.type == "cuda" else device


def _prepare(model: Transformer, rank: int, engine: EngineConfig) -> Transformer:
    """Shard, then quantize the slices (each rank quantizes only what it holds)."""
    shard_model(model, rank, engine.tensor_parallel_size)
    if engine.quantization is not None:
        from ..quant import quantize_model

        quantize_model(model, engine.quantization, group_size=engine.group_size)
    return model.eval()


def _worker(rank: int, addr: str, backend: str, config: ModelConfig, dtype: torch.dtype, device: str, state: dict,
            engine: EngineConfig, ready, timeout_s: float) -> None:
    """Ranks 1..N-1: build and shard the model, then run every forward rank 0 broadcasts until it says stop."""
    tp = engine.tensor_parallel_size
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole process group: rank 0 stops us
    try:
        device = _device_for(torch.device(device), rank)
        if device.type == "cuda":
            torch.cuda.set_device(device)
        if device.type == "cpu":
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // tp))  # the ranks share the machine's cores
        model = Transformer(config).to(device=device, dtype=dtype)
        model.load_state_dict(state)
        del state
        _prepare(model, rank, engine)
        ready.put((rank, weight_bytes(model), None))
    except BaseException as e:  # noqa: BLE001 - rank 0 reports it
        ready.put((rank, 0, f"{type(e).__name__}: {e}"))
        raise
    dist.init_process_group(backend, init_method=addr, rank=rank, world_size=tp, timeout=timedelta(seconds=timeout_s))
    control = dist.new_group(backend="gloo", timeout=IDLE)
    cache = None
    with torch.inference_mode():
        while True:
            box = [None]
            dist.broadcast_object_list(box, src=0, group=control)
            if box[0] is None:
                break
            (input_ids, positions, meta, last_only, logits_index), blocks = box[0]
            kv = None
            if meta is not None:
                if cache is None or (cache.num_blocks, cache.block_size) != blocks:
                    cache = PagedKVCache(model.config, blocks[0], blocks[1], device, dtype)
                kv = PagedAttention(cache, meta.to(device)[0])
            to = (lambda t: None if t is None else t.to(device))
            model(to(input_ids), to(positions), kv, last_only, to(logits_index))
    dist.destroy_process_group()


class TensorParallelWorkers:
    """Rank 0's handle on ranks 1..N-1: starts them, sends each forward, reports a dead one, stops them."""

    def __init__(self, model: Transformer, engine: EngineConfig, timeout_s: float = 60.0,
                 start_timeout_s: float = 600.0):
        """`engine`: the LLM's options (`tensor_parallel_size` ranks, `quantization` and `group_size` on each)."""
        tp = engine.tensor_parallel_size
        plan_shard(model.config, 0, tp)  # a head count that does not split fails here, before any process starts
        if dist.is_initialized():
            raise RuntimeError("a torch.distributed process group already exists in this process: close the "
                               "other tensor-parallel LLM first (llm.close())")
        self.tp, self.closed = tp, False
        device = model.device
        backend = "nccl" if device.type == "cuda" else "gloo"
        addr = f"tcp://127.0.0.1:{free_port()}"
        state = {k: v.detach().cpu() for k, v in model.state_dict().items()}  # to the workers in shared memory
        ctx = mp.get_context("spawn")
        ready = ctx.Queue()
        self.procs = [ctx.Process(target=_worker, daemon=True, name=f"tp-rank{r}",
                                  args=(r, addr, backend, model.config, model.dtype, str(device), state, engine,
                                        ready, timeout_s)) for r in range(1, tp)]
        for p in self.procs:
            p.start()
        del state
        self.model = _prepare(model, 0, engine)
        self.weight_bytes = {0: weight_bytes(model)}
        deadline = time.monotonic() + start_timeout_s
        while len(self.weight_bytes) < tp:  # poll, so a worker that dies while loading is reported, not awaited
            try:
                rank, nbytes, error = ready.get(timeout=0.2)
            except Exception:  # queue.Empty
                self._check_alive()
                if time.monotonic() > deadline:
                    self._kill()
                    raise RuntimeError(f"tensor-parallel workers did not start within {start_timeout_s} s")
                continue
            if error is not None:
                self._kill()
                raise RuntimeError(f"tensor-parallel worker rank {rank} failed to start: {error}")
            self.weight_bytes[rank] = nbytes
        dist.init_process_group(backend, init_method=addr, rank=0, world_size=tp, timeout=timedelta(seconds=timeout_s))
        self.control = dist.new_group(backend="gloo", timeout=IDLE)
        self._forward = model.forward
        model.forward = self.forward  # the engine calls the model as always; this sends the step first
        atexit.register(_close_ref, weakref.ref(self))

    def _check_alive(self) -> None:
        dead = [p for p in self.procs if not p.is_alive()]
        if dead:
            self._kill()
            raise RuntimeError("tensor-parallel worker " + ", ".join(f"{p.name} (pid {p.pid}) exited with code "
                                                                   f"{p.exitcode}" for p in dead)
                               + "; this LLM can no longer run: create a new one")

    def forward(self, input_ids, positions=None, kv=None, last_only=False, logits_index=None):
        """Rank 0's forward: broadcast the step, then run rank 0's shard (its layers meet the workers' there)."""
        if self.closed:
            raise RuntimeError("this tensor-parallel LLM is closed")
        self._check_alive()
        cpu = (lambda t: None if t is None else t.cpu())
        meta = blocks = None
        if kv is not None:
            meta, blocks = kv.attn_metadata.to("cpu")[0], (kv.kv_cache.num_blocks, kv.kv_cache.block_size)
        try:
            dist.broadcast_object_list([((cpu(input_ids), cpu(positions), meta, last_only, cpu(logits_index)),
                                         blocks)], src=0, group=self.control)
            return self._forward(input_ids, positions, kv, last_only, logits_index)
        except RuntimeError:
            for _ in range(20):  # a worker whose socket closed is usually still being reaped
                if any(not p.is_alive() for p in self.procs):
                    self._check_alive()
                time.sleep(0.05)
            raise

    def _kill(self) -> None:
        self.closed = True
        for p in self.procs:
            if p.is_alive():
                p.kill()
            p.join(timeout=5)
        if dist.is_initialized():
            dist.destroy_process_group()

    def close(self) -> None:
        """Tell the workers to stop, wait for them, and leave the process group (idempotent)."""
        if self.closed:
            return
        self.closed = True
        try:
            if all(p.is_alive() for p in self.procs):
                dist.broadcast_object_list([None], src=0, group=self.control)
            for p in self.procs:
                p.join(timeout=10)
        except RuntimeError:  # a worker already gone: nothing to tell it; the ones left are killed below
            pass
        finally:
            self._kill()


def _close_ref(ref) -> None:
    workers = ref()
    if workers is not None:
        workers.close()
