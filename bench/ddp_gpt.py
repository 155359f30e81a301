"""PyTorch DDP twin of `dscpp train` for the throughput benchmark (bench/ddp_vs_dscpp.sh).

Trains the same GPT (tests/golden/gpt_reference.py, the module the golden tests check against
dscpp's) with torch.nn.parallel.DistributedDataParallel over gloo and torch.optim.AdamW, on the
bytes of a text file cut by the same data contract (sample j = tok[j*T : j*T+T+1]), one intra-op
thread per rank. Start it with dscpp launch, whose RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT are
what torch.distributed's env:// expects:

  build/dscpp launch --num_procs 2 .venv/bin/python bench/ddp_gpt.py --data FILE --steps 40 ...

Prints steady-state tokens/s (steps after the warm-up), the training loop's wall time and the
last step's loss (the mean over every rank's micro-batch, as dscpp train prints it) on rank 0, and
each rank's peak RSS. --bf16 runs forward and loss under torch.autocast("cpu", torch.bfloat16),
PyTorch's mixed precision on a CPU (fp32 weights, gradients and optimizer). --gas N accumulates N
micro-batches per optimizer step (no_sync until the last), taking them as dscpp does; --init starts
from dscpp's initial weights (otherwise PyTorch's default init, which starts at a loss near 160).
Attention runs through F.scaled_dot_product_attention (DSCPP_GPT_ATTENTION, default sdpa here), as
a PyTorch 2.x user's model does. bench/peers/train_gpt.py runs the other peers (and DDP) from a
DeepSpeed config file; this one keeps DDP's own knobs (bucket size, --breakdown).
"""
import argparse
import contextlib
import os
import resource
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "golden"))
from gpt_reference import GPT, st_load  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--n_layer", type=int, default=4)
    ap.add_argument("--n_head", type=int, default=4)
    ap.add_argument("--n_embd", type=int, default=256)
    ap.add_argument("--block_size", type=int, default=128)
    ap.add_argument("--micro_batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--bucket_cap_mb", type=float, default=25.0)
    ap.add_argument("--bf16", action="store_true")
    ap.add_argument("--gas", type=int, default=1, help="micro-batches per optimizer step")
    ap.add_argument("--init", help="initial weights (safetensors: dscpp train --steps 0 --save_final)")
    ap.add_argument("--breakdown", action="store_true",
                    help="print rank 0's forward, backward and optimizer ms of every step")
    a = ap.parse_args()
    torch.set_num_threads(1)
    os.environ.setdefault("DSCPP_GPT_ATTENTION", "sdpa")
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(1234)
    model = GPT(256, a.block_size, a.n_layer, a.n_head, a.n_embd)
    if a.init:
        tensors, _ = st_load(a.init)
        model.load_state_dict({k: v.float() for k, v in tensors.items()}, strict=True)
    ddp = DDP(model, bucket_cap_mb=a.bucket_cap_mb)
    opt = torch.optim.AdamW(ddp.parameters(), lr=a.lr, weight_decay=0.01)
    with open(a.data, "rb") as f:
        tok = torch.frombuffer(bytearray(f.read()), dtype=torch.uint8).long()
    T, b, gas = a.block_size, a.micro_batch, a.gas
    n = (tok.numel() - 1) // T
    B = b * world * gas
    warmup = min(a.warmup, a.steps - 1)
    t_start = time.perf_counter()
    t_steady = t_start
    for s in range(a.steps):
        if s == warmup:
            t_steady = time.perf_counter()
        t0 = time.perf_counter()
        t_fwd = t_bwd = 0.0
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for k in range(gas):
            # dscpp's data contract (include/dscpp/data.h): micro-step k of rank r
            idx = [(s * B + (k * world + rank) * b + i) % n for i in range(b)]
            x = torch.stack([tok[j * T:j * T + T] for j in idx])
            y = torch.stack([tok[j * T + 1:j * T + T + 1] for j in idx])
            # the gradients are reduced once, in the last micro-batch's backward
            with ddp.no_sync() if k + 1 < gas else contextlib.nullcontext():
                t1 = time.perf_counter()
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.bf16):
                    loss = GPT.cross_entropy(ddp(x), y) / gas
                t2 = time.perf_counter()
                loss.backward()  # returns once DDP's all-reduces are done
                t3 = time.perf_counter()
                t_fwd += t2 - t1
                t_bwd += t3 - t2
            total += loss.item()
        t4 = time.perf_counter()
        torch.nn.utils.clip_grad_norm_(ddp.parameters(), 1.0)
        opt.step()
        if a.breakdown and rank == 0:
            print("step %d: window %.1f ms: forward %.1f ms, backward %.1f ms, optimizer %.1f ms"
                  % (s + 1, (time.perf_counter() - t0) * 1e3, t_fwd * 1e3, t_bwd * 1e3,
                     (time.perf_counter() - t4) * 1e3), flush=True)
        if (s + 1) % 10 == 0 or s + 1 == a.steps:
            mean = torch.tensor(total)
            dist.all_reduce(mean)
            if rank == 0:
                print("step %d loss %.4f" % (s + 1, mean.item() / world), flush=True)
    dist.barrier()
    end = time.perf_counter()
    elapsed = end - t_steady
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    print("rank %d: peak RSS %.1f MiB" % (rank, peak), flush=True)
    if rank == 0:
        print("throughput: %.1f tokens/s over steps %d..%d (after %d warm-up steps)"
              % ((a.steps - warmup) * B * T / elapsed, warmup + 1, a.steps, warmup), flush=True)
        print("train time: %.2f s for %d samples (%d steps)" % (end - t_start, a.steps * B, a.steps),
              flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
