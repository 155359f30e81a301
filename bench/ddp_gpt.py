"""PyTorch DDP twin of `dscpp train` for the throughput benchmark (bench/ddp_vs_dscpp.sh).

Trains the same GPT (tests/golden/gpt_reference.py, the module the golden tests check against
dscpp's) with torch.nn.parallel.DistributedDataParallel over gloo and torch.optim.AdamW, on the
bytes of a text file cut by the same data contract (sample j = tok[j*T : j*T+T+1]), one intra-op
thread per rank. Start it with dscpp launch, whose RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT are
what torch.distributed's env:// expects:

  build/dscpp launch --num_procs 2 /usr/bin/python3 bench/ddp_gpt.py --data FILE --steps 40 ...

Prints steady-state tokens/s (steps after the warm-up) on rank 0 and each rank's peak RSS.
"""
import argparse
import os
import resource
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "golden"))
from gpt_reference import GPT  # noqa: E402


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
    a = ap.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(1234)
    model = GPT(256, a.block_size, a.n_layer, a.n_head, a.n_embd)
    ddp = DDP(model, bucket_cap_mb=a.bucket_cap_mb)
    opt = torch.optim.AdamW(ddp.parameters(), lr=a.lr, weight_decay=0.01)
    with open(a.data, "rb") as f:
        tok = torch.frombuffer(bytearray(f.read()), dtype=torch.uint8).long()
    T, b = a.block_size, a.micro_batch
    n = (tok.numel() - 1) // T
    B = b * world
    t_steady = None
    for s in range(a.steps):
        if s == a.warmup:
            t_steady = time.perf_counter()
        idx = [(s * B + rank * b + i) % n for i in range(b)]
        x = torch.stack([tok[j * T:j * T + T] for j in idx])
        y = torch.stack([tok[j * T + 1:j * T + T + 1] for j in idx])
        loss = GPT.cross_entropy(ddp(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(ddp.parameters(), 1.0)
        opt.step()
        if rank == 0 and (s + 1) % 10 == 0:
            print("step %d loss %.4f" % (s + 1, loss.item()), flush=True)
    dist.barrier()
    elapsed = time.perf_counter() - t_steady
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    print("rank %d: peak RSS %.1f MiB" % (rank, peak), flush=True)
    if rank == 0:
        print("throughput: %.1f tokens/s over steps %d..%d (after %d warm-up steps)"
              % ((a.steps - a.warmup) * B * T / elapsed, a.warmup + 1, a.steps, a.warmup), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
