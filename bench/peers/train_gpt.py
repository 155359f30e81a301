"""The peers of `dscpp train`: what a user would pick instead today, on identical work.

Trains the GPT of tests/golden/gpt_reference.py (the module the golden tests hold dscpp's to) with
one of
  ddp          torch.nn.parallel.DistributedDataParallel, eager
  ddp_compile  the same under torch.compile (inductor, C++/OpenMP code on a CPU)
  fsdp2        torch.distributed.fsdp.fully_shard per transformer block, then the root (ZeRO-3's
               analogue: parameters, gradients and optimizer state sharded)
  hsdp         fsdp2 over a 2-D mesh (hosts x ranks per host, LOCAL_WORLD_SIZE ranks per host):
               sharded inside each host, replicated across hosts (FSDP2's HSDP; what a PyTorch
               user picks across hosts where dscpp's hierarchy and ZeRO++ apply)
  deepspeed    deepspeed.initialize with the same DeepSpeed config file dscpp gets (its stage,
               bf16, optimizer and clipping), on DeepSpeed's CPU accelerator over gloo
from the same DeepSpeed config file dscpp train reads: train_micro_batch_size_per_gpu and
gradient_accumulation_steps (or train_batch_size), the optimizer (Adam/AdamW: lr, betas, eps,
weight_decay), gradient_clipping and bf16.enabled (or torch_autocast.enabled, read as bf16). The
other systems take those from the file;
DeepSpeed takes the whole file. bf16 means, per system, what its users run: DDP and
DDP + compile under torch.autocast("cpu", bfloat16) (fp32 weights, gradients and optimizer);
FSDP2 with MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=bf16) (fp32 sharded master
weights); DeepSpeed's own bf16 (bf16 model, fp32 master weights and optimizer state), as dscpp's.

The data is dscpp's contract without shuffling (include/dscpp/data.h: sample j = tok[j*T : j*T+T+1]
of a byte file, micro-step k of rank r of step s takes samples (s*B + (k*world + r)*b + i) mod n),
the initial weights dscpp's (--init, written by `dscpp train --steps 0 --save_final`, read one
tensor at a time; with it FSDP2 builds the model on the meta device and DeepSpeed's stage 3 under
deepspeed.zero.Init, so no rank ever holds the whole model: how their users build one that does
not fit), attention
through F.scaled_dot_product_attention (DSCPP_GPT_ATTENTION, default sdpa here), one intra-op
thread per rank. Start it with dscpp launch, whose RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT are what
torch.distributed's env:// expects:

  build/dscpp launch --num_procs 2 .venv/bin/python bench/peers/train_gpt.py --system fsdp2 \\
      --config ds.json --data FILE --init W.safetensors --n_layer 6 --n_head 6 --n_embd 384 \\
      --block_size 256 --steps 30

With --save_dir and --save_interval K it saves a checkpoint after every K-th step, the way each
system's users save one (bench/checkpoint_bench.sh, PEERS=1): DDP and FSDP2 through
torch.distributed.checkpoint (DCP) of get_state_dict(model, optimizer), `dcp.save`, or with
--save_mode async `dcp.async_save` (a thread writes after the state was staged; a save waits for
the one before it); DeepSpeed with engine.save_checkpoint (with --save_mode async its
checkpoint.writer.decoupled, as dscpp's). Rank 0 then prints "save K: blocked B s" per save and
at the end "saves: sync S s, stall T s" in bench/checkpoint_bench.sh's terms: a synchronous
save's time (mean of saves 2..), and a background save's stall, the seconds it blocked plus what
the steps while it was written took beyond the median step without a save in flight (mean of
the saves but the last, which the end waits for).

Prints on rank 0 what bench/peers.sh reads, in dscpp train's words: "step K loss L" every 10 steps
and at the end (the mean over every rank's micro-batches), "throughput: X tokens/s over steps ..."
(steps after the warm-up), "train time: ..."; and on every rank "rank R: peak RSS M MiB". A system
that cannot run prints "peer failed: <system>: <the error>" and exits 3.
"""
import argparse
import contextlib
import json
import os
import resource
import sys
import time
import traceback

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests",
                                "golden"))
from gpt_reference import GPT, st_tensors  # noqa: E402

SYSTEMS = ("ddp", "ddp_compile", "fsdp2", "hsdp", "deepspeed")


def batch_settings(cfg, world):
    """micro-batch per rank and accumulation steps, as DeepSpeed resolves the batch triple."""
    micro = cfg.get("train_micro_batch_size_per_gpu")
    gas = cfg.get("gradient_accumulation_steps")
    total = cfg.get("train_batch_size")
    if micro is None and gas is None:
        micro, gas = total // world, 1
    elif micro is None:
        micro = total // (gas * world)
    elif gas is None:
        gas = (total // (micro * world)) if total else 1
    return int(micro), int(gas)


def adam_settings(cfg):
    opt = cfg.get("optimizer", {})
    kind = opt.get("type", "AdamW")
    if kind.lower() not in ("adam", "adamw"):
        raise SystemExit("train_gpt.py: optimizer %s: the peers run Adam/AdamW only" % kind)
    p = opt.get("params", {})
    # DeepSpeed's "Adam" is AdamW unless adam_w_mode is false; its default weight decay is 0.
    return dict(lr=p.get("lr", 1e-3), betas=tuple(p.get("betas", (0.9, 0.999))),
                eps=p.get("eps", 1e-8), weight_decay=p.get("weight_decay", 0.0))


def new_gpt(a):
    return GPT(256, a.block_size, a.n_layer, a.n_head, a.n_embd)


@torch.no_grad()
def load_init(a, model, put):
    """Puts --init's weights into model's parameters one tensor at a time, through
    put(parameter, fp32 values): what a user does with a model that fills memory (the file is
    never held whole)."""
    params = dict(model.named_parameters())
    seen = set()
    for name, t in st_tensors(a.init):
        if name not in params:
            raise SystemExit("train_gpt.py: %s: %s is not a parameter of the GPT" % (a.init, name))
        put(params[name], t.float())
        seen.add(name)
    if seen != set(params):
        raise SystemExit("train_gpt.py: %s lacks %s" % (a.init, sorted(set(params) - seen)))


def build_model(a):
    """The whole model on this rank (DDP's replicas; DeepSpeed's stages 0-2 before it shards)."""
    model = new_gpt(a)
    if a.init:
        load_init(a, model, lambda p, t: p.copy_(t))
    return model


class TorchStep:
    """The step of the PyTorch peers: clip by the global norm, torch.optim.AdamW, zero_grad."""

    def __init__(self, parameters, cfg):
        self.params = list(parameters)
        self.opt = torch.optim.AdamW(self.params, **adam_settings(cfg))
        self.clip = cfg.get("gradient_clipping", 0.0)

    def step(self):
        if self.clip > 0:
            torch.nn.utils.clip_grad_norm_(self.params, self.clip)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)


class Ddp(TorchStep):
    """DDP, eager or under torch.compile; bf16 under autocast."""

    def __init__(self, a, cfg, bf16):
        from torch.nn.parallel import DistributedDataParallel as DDP
        self.ddp = DDP(build_model(a))
        self.model = torch.compile(self.ddp) if a.system == "ddp_compile" else self.ddp
        super().__init__(self.ddp.parameters(), cfg)
        self.bf16 = bf16

    def micro_step(self, x, y, last, gas):
        with self.ddp.no_sync() if not last else contextlib.nullcontext():
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.bf16):
                loss = GPT.cross_entropy(self.model(x), y)
            (loss / gas).backward()
        return loss.item()


class Fsdp2(TorchStep):
    """fully_shard per block, then the root (reshard after forward: ZeRO-3)."""

    def __init__(self, a, cfg, bf16):
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        from torch.distributed.tensor import distribute_tensor
        # With --init, as FSDP2's users build a model that does not fit one rank: on the meta
        # device, sharded, then given memory and each rank's shard of the weights.
        if a.init:
            with torch.device("meta"):
                model = new_gpt(a)
        else:
            model = build_model(a)
        if a.system == "hsdp":
            local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
            mesh = init_device_mesh("cpu", (dist.get_world_size() // local, local),
                                    mesh_dim_names=("replicate", "shard"))
        else:
            mesh = init_device_mesh("cpu", (dist.get_world_size(),))
        kw = {"mesh": mesh}
        if bf16:
            kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                                   reduce_dtype=torch.bfloat16)
        for block in model.h:
            fully_shard(block, **kw)
        fully_shard(model, **kw)
        if a.init:
            model.to_empty(device="cpu")
            load_init(a, model, lambda p, t: p.to_local().copy_(
                distribute_tensor(t, p.device_mesh, p.placements, src_data_rank=None).to_local()))
        self.model = model
        super().__init__(model.parameters(), cfg)

    def micro_step(self, x, y, last, gas):
        self.model.set_requires_gradient_sync(last)
        loss = GPT.cross_entropy(self.model(x), y)
        (loss / gas).backward()
        return loss.item()


class DeepSpeed:
    """deepspeed.initialize with the config file itself; the engine accumulates and steps."""

    def __init__(self, a, cfg, bf16):
        import deepspeed
        deepspeed.init_distributed(dist_backend="gloo")
        if cfg.get("zero_optimization", {}).get("stage", 0) == 3:
            # As DeepSpeed's users build a model for ZeRO-3 (and its Hugging Face integration
            # does): partitioned as it is constructed, each weight then set from rank 0's.
            with deepspeed.zero.Init(config_dict_or_path=cfg):
                model = new_gpt(a)
            if a.init:
                rank = dist.get_rank()

                def put(p, t):
                    with deepspeed.zero.GatheredParameters([p], modifier_rank=0):
                        if rank == 0:
                            p.copy_(t)
                load_init(a, model, put)
        else:
            model = build_model(a)
        self.engine, _, _, _ = deepspeed.initialize(model=model, config=cfg,
                                                    model_parameters=None)

    def micro_step(self, x, y, last, gas):
        loss = GPT.cross_entropy(self.engine(x), y)
        self.engine.backward(loss)  # DeepSpeed divides by gradient_accumulation_steps
        self.engine.step()  # a no-op until the accumulation boundary
        return loss.item()

    def step(self):
        pass


class Saver:
    """Saves after every save_interval-th step and times it (see the module's text)."""

    def __init__(self, a, trainer):
        self.a, self.trainer = a, trainer
        self.rank = dist.get_rank()
        self.pending = None      # (save number, future) of an async save in flight
        self.blocked = []        # seconds each save call blocked the training thread
        self.in_flight = {}      # save number -> step times while it was written
        self.free_steps = []     # step times with no save in flight (and no save in them)
        self.waited = {}         # save number -> seconds the next save waited for it to end
        self.decoupled = a.system == "deepspeed" and a.save_mode == "async"
        # async_save's thread runs collectives of its own while training runs FSDP2's: on the
        # training's process group they interleave and hang, so it gets a group of its own (as
        # PyTorch's documentation of async_save advises).
        self.save_group = dist.new_group(backend="gloo") if a.save_mode == "async" and \
            a.system != "deepspeed" else None

    def _state(self):
        from torch.distributed.checkpoint.state_dict import get_state_dict
        model, opt = get_state_dict(self.trainer.model, self.trainer.opt)
        return {"model": model, "optim": opt}

    def _done(self):
        """Whether the save in flight is written (DeepSpeed's decoupled save commits, waiting
        for its write, in the first engine.step() after it: one step holds all it costs)."""
        if self.pending is None:
            return True
        n, fut = self.pending
        if self.decoupled or fut.done():
            if not self.decoupled:
                fut.result()
            self.pending = None
            return True
        return False

    def after_step(self, step, seconds):
        if self.pending is not None:
            self.in_flight[self.pending[0]].append(seconds)
            self._done()
        elif step > 1 and step % self.a.save_interval != 1:
            self.free_steps.append(seconds)
        if step % self.a.save_interval:
            return
        n = len(self.blocked)
        path = os.path.join(self.a.save_dir, "step%d" % step)
        if self.pending is not None and self.pending[1] is not None:  # one at a time, as dscpp
            t_wait = time.perf_counter()
            self.pending[1].result()
            # The wait is the earlier save's cost, not this one's.
            self.waited[self.pending[0]] = time.perf_counter() - t_wait
        self.pending = None
        t0 = time.perf_counter()
        if self.a.system == "deepspeed":
            self.trainer.engine.save_checkpoint(self.a.save_dir, tag="step%d" % step)
            if self.decoupled:
                self.pending = (n, None)
                self.in_flight[n] = []
        elif self.a.save_mode == "sync":
            import torch.distributed.checkpoint as dcp
            dcp.save(self._state(), checkpoint_id=path)
        else:
            import torch.distributed.checkpoint as dcp
            fut = dcp.async_save(self._state(), checkpoint_id=path,
                                 process_group=self.save_group)
            fut = getattr(fut, "upload_completion", fut)  # an AsyncSaveResponse in newer torch
            self.pending = (n, fut)
            self.in_flight[n] = []
        self.blocked.append(time.perf_counter() - t0)
        if self.rank == 0:
            print("save %d: blocked %.3f s" % (n + 1, self.blocked[-1]), flush=True)

    def finish(self):
        if self.pending is not None and self.pending[1] is not None:
            self.pending[1].result()
        if self.decoupled and self.pending is not None:  # the last save: commit it before exit
            self.trainer.engine._commit_decoupled_checkpoint()
        self.pending = None
        if self.rank != 0 or not self.blocked:
            return
        import statistics
        sync = statistics.mean(self.blocked[1:] or self.blocked)
        base = statistics.median(self.free_steps) if self.free_steps else 0.0
        stalls = [self.blocked[n] + self.waited.get(n, 0.0) +
                  sum(w - base for w in self.in_flight.get(n, []))
                  for n in range(max(1, len(self.blocked) - 1))]
        print("saves: sync %.3f s, stall %.3f s (%s)" % (sync, statistics.mean(stalls),
                                                        self.a.save_mode), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--system", choices=SYSTEMS, required=True)
    ap.add_argument("--config", required=True, help="the DeepSpeed config file dscpp train reads")
    ap.add_argument("--data", required=True, help="a byte file (vocabulary 256)")
    ap.add_argument("--init", help="initial weights (safetensors, dscpp train --steps 0 --save_final)")
    ap.add_argument("--n_layer", type=int, default=6)
    ap.add_argument("--n_head", type=int, default=6)
    ap.add_argument("--n_embd", type=int, default=384)
    ap.add_argument("--block_size", type=int, default=256)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5, help="steps not timed (compilation included)")
    ap.add_argument("--save_dir", help="save checkpoints here (see --save_interval)")
    ap.add_argument("--save_interval", type=int, default=0)
    ap.add_argument("--save_mode", choices=["sync", "async"], default="sync")
    a = ap.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    os.environ.setdefault("DSCPP_GPT_ATTENTION", "sdpa")
    with open(a.config) as f:
        cfg = json.load(f)
    # torch_autocast (fp32 weights, forward under autocast): DeepSpeed reads it from the file;
    # for the others it is their bf16 (DDP's is autocast already).
    bf16 = bool(cfg.get("bf16", {}).get("enabled", False)) or \
        bool(cfg.get("torch_autocast", {}).get("enabled", False))
    if a.system == "deepspeed":
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
        if a.save_mode == "async":  # DeepSpeed's background save, as dscpp's config asks for it
            cfg.setdefault("checkpoint", {})["writer"] = {"decoupled": True}
        # What DeepSpeed's own launcher sets and its checkpoint writers read (one node here).
        local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        os.environ.setdefault("LOCAL_SIZE", str(local))
        os.environ.setdefault("CROSS_SIZE", str(int(os.environ.get("WORLD_SIZE", "1")) // local))
        os.environ.setdefault("CROSS_RANK", str(int(os.environ.get("RANK", "0")) // local))
    else:
        dist.init_process_group("gloo")
    torch.manual_seed(1234)
    try:
        system = {"ddp": Ddp, "ddp_compile": Ddp, "fsdp2": Fsdp2, "hsdp": Fsdp2,
                  "deepspeed": DeepSpeed}[a.system]
        trainer = system(a, cfg, bf16)
    except Exception as e:  # a peer that cannot run is a row that says why
        traceback.print_exc()
        print("peer failed: %s: %s" % (a.system, str(e).splitlines()[0] if str(e) else type(e).__name__),
              flush=True)
        sys.exit(3)
    rank, world = dist.get_rank(), dist.get_world_size()
    micro, gas = batch_settings(cfg, world)
    with open(a.data, "rb") as f:
        tok = torch.frombuffer(bytearray(f.read()), dtype=torch.uint8).long()
    T = a.block_size
    n = (tok.numel() - 1) // T
    B = micro * world * gas
    warmup = min(a.warmup, a.steps - 1)
    saver = Saver(a, trainer) if a.save_dir and a.save_interval > 0 else None
    t_start = t_steady = time.perf_counter()
    for s in range(a.steps):
        t_step = time.perf_counter()
        if s == warmup:
            t_steady = time.perf_counter()
        total = 0.0
        for k in range(gas):
            idx = [(s * B + (k * world + rank) * micro + i) % n for i in range(micro)]
            x = torch.stack([tok[j * T:j * T + T] for j in idx])
            y = torch.stack([tok[j * T + 1:j * T + T + 1] for j in idx])
            total += trainer.micro_step(x, y, k + 1 == gas, gas)
        trainer.step()
        if saver:
            saver.after_step(s + 1, time.perf_counter() - t_step)
        if (s + 1) % 10 == 0 or s + 1 == a.steps:
            mean = torch.tensor(total / gas)
            dist.all_reduce(mean)
            if rank == 0:
                print("step %d loss %.4f" % (s + 1, mean.item() / world), flush=True)
    if saver:
        saver.finish()
    dist.barrier()
    end = time.perf_counter()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    print("rank %d: peak RSS %.1f MiB" % (rank, peak), flush=True)
    if rank == 0:
        print("throughput: %.1f tokens/s over steps %d..%d (after %d warm-up steps)"
              % ((a.steps - warmup) * B * T / (end - t_steady), warmup + 1, a.steps, warmup),
              flush=True)
        print("train time: %.2f s for %d samples (%d steps)" % (end - t_start, a.steps * B, a.steps),
              flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
