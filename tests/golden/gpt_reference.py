#!/usr/bin/env python3
"""PyTorch twin of dscpp's built-in GPT, data contract and training step: the golden reference.

Run with the venv's python, which has torch (scripts/setup.sh makes .venv):

  .venv/bin/python tests/golden/gpt_reference.py forward --weights W.safetensors \
      --tokens T.safetensors --out O.safetensors [--grads]
      Loss and logits (and, with --grads, every parameter's gradient of the loss) for the
      tokens file's "idx" [B, T] (and optional "targets" [B, T]). Writes "logits" [B, T, V],
      "loss" (0-d) and "grad.<parameter name>".

  .venv/bin/python tests/golden/gpt_reference.py train --weights W.safetensors \
      --config ds_config.json --data-spec SPEC --steps K --out metrics.jsonl \
      [--out-weights final.safetensors] [--world-size N] [--seq-len T] [--shuffle --seed S]
      Trains K optimizer steps in one process on exactly the batches dscpp's data contract gives
      (all ranks' micro-batches of a step, in rank/micro-step order), the way DeepSpeed's engine
      does: each micro-batch loss divided by gradient_accumulation_steps * world_size before
      backward (so the gradient is the average over the global batch), gradient clipping by the
      global norm (DeepSpeed's clip_grad_norm_: scale by max/(norm + 1e-6) when that is < 1),
      the config's optimizer, then the scheduler's step (DeepSpeed steps the LR schedule after
      the optimizer, so optimizer step k uses the schedule's value at iteration k - 1, and step
      0 the value the scheduler set at construction). Writes one JSON line per step:
      {"step": k (1-based), "loss": mean micro-batch loss, "lr": lr used, "grad_norm": global
      gradient norm before clipping}.

  .venv/bin/python tests/golden/gpt_reference.py samples --data-spec SPEC --config ds.json \
      --steps K --out S.safetensors [--seq-len T] [--world-size N] [--shuffle --seed S]
      The batches of the first K steps: "indices" [K, B], "inputs" and "targets" [K, B, T].

SPEC is a file (FILE.txt: bytes, vocab 256; FILE.bin: little-endian uint16; FILE.safetensors:
the 1-D integer tensor "tokens") or the built-in reverse task,
"builtin[:seed=1234,num_digits=8,num_symbols=10,num_problems=1048576]" (NOTE [built-in task] in
include/dscpp/data.h; generated here bit for bit as in src/data/reverse_task.cpp).

The model config comes from the weights file's __metadata__ (written by dscpp's GPT save) or
from --n-head etc. Exit status 0 on success, 2 on a usage or input error (message on stderr).
"""

import argparse
import collections
import json
import math
import os
import re
import struct
import sys

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError as e:  # pragma: no cover
    sys.stderr.write("gpt_reference.py: cannot import torch (%s). HINT: run scripts/setup.sh, "
                     "which installs torch into .venv, and use .venv/bin/python.\n" % e)
    sys.exit(3)


class UsageError(Exception):
    pass


# --------------------------------------------------------------------------------------------
# safetensors (json + torch.frombuffer; the safetensors package is not needed)

DTYPES = {
    "BOOL": torch.bool, "U8": torch.uint8, "I8": torch.int8, "I16": torch.int16,
    "I32": torch.int32, "I64": torch.int64, "F16": torch.float16, "BF16": torch.bfloat16,
    "F32": torch.float32, "F64": torch.float64,
}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}


def st_load(path):
    """Returns (OrderedDict name -> tensor, metadata dict). Validates offsets and sizes."""
    metadata = {}
    tensors = collections.OrderedDict(st_tensors(path, metadata))
    return tensors, metadata


def st_tensors(path, metadata=None):
    """Yields (name, tensor) in file order, reading one tensor's bytes at a time (a model larger
    than half the memory can be loaded into its parameters one by one); fills `metadata` (a dict)
    with the file's. Validates offsets and sizes."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        head = f.read(8)
        if len(head) < 8:
            raise UsageError("%s: too short for a safetensors file" % path)
        (n,) = struct.unpack("<Q", head)
        if 8 + n > size:
            raise UsageError("%s: header length %d does not fit" % (path, n))
        header = json.loads(f.read(n).decode("utf-8"), object_pairs_hook=collections.OrderedDict)
        body = size - 8 - n
        if metadata is not None:
            metadata.update(header.pop("__metadata__", None) or {})
        else:
            header.pop("__metadata__", None)
        covered = 0
        for name, info in header.items():
            dtype = DTYPES[info["dtype"]]
            shape = [int(d) for d in info["shape"]]
            begin, end = (int(o) for o in info["data_offsets"])
            numel = 1
            for d in shape:
                numel *= d
            item = torch.empty((), dtype=dtype).element_size()
            if end - begin != numel * item or end > body:
                raise UsageError("%s: tensor %s: bad data_offsets" % (path, name))
            covered += end - begin
            t = torch.empty(shape, dtype=dtype)
            if numel:
                f.seek(8 + n + begin)
                if f.readinto(t.view(-1).view(torch.uint8).numpy()) != end - begin:
                    raise UsageError("%s: tensor %s: the file ends early" % (path, name))
            yield name, t
        if covered != body:
            raise UsageError("%s: data section has %d bytes, tensors cover %d" % (path, body, covered))


def st_save(path, tensors, metadata=None):
    """tensors: iterable of (name, tensor) in file order."""
    header = collections.OrderedDict()
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    blobs = []
    offset = 0
    for name, t in tensors:
        t = t.detach().cpu().contiguous()
        raw = b"" if t.numel() == 0 else t.reshape(-1).view(torch.uint8).numpy().tobytes()
        header[name] = {"dtype": DTYPE_NAMES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
        blobs.append(raw)
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


# --------------------------------------------------------------------------------------------
# GPT-2, line for line as src/models/gpt.cpp. Two of its operations take another form there with
# the same values in fp32 (NOTE [GPT kernels]): the causal mask is added (0 or -inf) in place
# instead of masked_fill, and in bf16 the layer norms normalise in fp32.

def attention_path(q):
    """The attention DSCPP_GPT_ATTENTION chooses for q, as the C++ GPT chooses it (NOTE [GPT
    attention] in src/models/fused_ops.h): sdpa, math, or auto, the measured default."""
    name = os.environ.get("DSCPP_GPT_ATTENTION", "auto") or "auto"
    if name in ("sdpa", "math"):
        return name
    if name != "auto":
        raise UsageError("DSCPP_GPT_ATTENTION=%r names no attention path: auto, sdpa or math" % name)
    return "math" if q.device.type == "cpu" and q.dtype == torch.bfloat16 else "sdpa"


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd, n_head):
        super().__init__()
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        self.n_embd = n_embd
        self.n_head = n_head

    def forward(self, x):
        b, t, c = x.shape
        hs = c // self.n_head
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        q = q.view(b, t, self.n_head, hs).transpose(1, 2)
        k = k.view(b, t, self.n_head, hs).transpose(1, 2)
        v = v.view(b, t, self.n_head, hs).transpose(1, 2)
        if attention_path(q) == "sdpa":
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
            future = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
            att = att.masked_fill(future, float("-inf"))
            att = torch.softmax(att, -1)
            y = torch.matmul(att, v)
        y = y.transpose(1, 2).contiguous().view(b, t, c)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, n_embd):
        super().__init__()
        self.c_fc = nn.Linear(n_embd, 4 * n_embd)
        self.c_proj = nn.Linear(4 * n_embd, n_embd)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="none"))


class Block(nn.Module):
    def __init__(self, n_embd, n_head):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd, eps=1e-5)
        self.attn = CausalSelfAttention(n_embd, n_head)
        self.ln_2 = nn.LayerNorm(n_embd, eps=1e-5)
        self.mlp = MLP(n_embd)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, vocab_size, block_size, n_layer, n_head, n_embd):
        super().__init__()
        if n_embd % n_head:
            raise UsageError("n_embd %d is not divisible by n_head %d" % (n_embd, n_head))
        self.vocab_size = vocab_size
        self.block_size = block_size
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.h = nn.ModuleList([Block(n_embd, n_head) for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(n_embd, eps=1e-5)

    def forward(self, idx):
        t = idx.shape[1]
        pos = torch.arange(t, dtype=torch.long)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        x = self.ln_f(x)
        return F.linear(x, self.wte.weight).float()

    @staticmethod
    def cross_entropy(logits, targets):
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))


def model_from_weights(path, args):
    tensors, meta = st_load(path)
    cfg = {}
    for key in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd"):
        value = getattr(args, key, None)
        if value is None and key in meta:
            value = int(meta[key])
        cfg[key] = value
    # What the shapes say, where the metadata is silent.
    if cfg["vocab_size"] is None:
        cfg["vocab_size"] = tensors["wte.weight"].shape[0]
    if cfg["block_size"] is None:
        cfg["block_size"] = tensors["wpe.weight"].shape[0]
    if cfg["n_embd"] is None:
        cfg["n_embd"] = tensors["wte.weight"].shape[1]
    if cfg["n_layer"] is None:
        cfg["n_layer"] = len({n.split(".")[1] for n in tensors if n.startswith("h.")})
    if cfg["n_head"] is None:
        raise UsageError("%s has no n_head in its metadata: pass --n-head" % path)
    model = GPT(**cfg)
    model.load_state_dict({k: v.float() for k, v in tensors.items()}, strict=True)
    return model, cfg, meta


# --------------------------------------------------------------------------------------------
# The data contract (include/dscpp/data.h: NOTE [data contract], [batch split], [built-in task])

M64 = (1 << 64) - 1
GOLDEN_GAMMA = 0x9E3779B97F4A7C15
TASK_STREAM = 0x7461736B
SHUFFLE_STREAM = 0x73687566
PARTITION_KEY = 0x5EEDF00D
HELD_OUT_SEED_KEY = 0x686F6C64
HELD_OUT_BUCKETS = 8


def mix64(z):
    z &= M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


class SplitMix64:
    def __init__(self, seed, a, b):
        self.state = mix64(mix64((seed & M64) ^ GOLDEN_GAMMA) ^ (a & M64)) ^ (b & M64)

    def next(self):
        self.state = (self.state + GOLDEN_GAMMA) & M64
        return mix64(self.state)

    def below(self, n):
        return self.next() % n


class ReverseTask:
    def __init__(self, seed=1234, num_digits=8, num_symbols=10, num_problems=1 << 20,
                 held_out=False):
        self.seed, self.k, self.s = seed, num_digits, num_symbols
        self.num_problems, self.held_out = num_problems, held_out
        self.block_size = 2 * num_digits + 2
        self.vocab_size = num_symbols + 2
        self.name = "builtin reverse task (seed %d)" % seed

    def is_held_out(self, digits):
        v = 0
        for d in digits:
            v = (v * self.s + d) & M64
        return mix64(v ^ PARTITION_KEY) % HELD_OUT_BUCKETS == 0

    def digits(self, j):
        rng = SplitMix64(self.seed, TASK_STREAM, j)
        while True:
            d = [rng.below(self.s) for _ in range(self.k)]
            if self.is_held_out(d) == self.held_out:
                return d

    def problem(self, j):
        d = self.digits(j)
        return [self.s] + d + [self.s + 1] + d[::-1]

    def __len__(self):
        return self.num_problems * self.block_size + 1

    def read(self, begin, count):
        out, cached, prob = [], -1, None
        for pos in range(begin, begin + count):
            j = pos // self.block_size
            if j == self.num_problems:  # the final BOS
                out.append(self.s)
                continue
            if j != cached:
                prob, cached = self.problem(j), j
            out.append(prob[pos % self.block_size])
        return torch.tensor(out, dtype=torch.long)


class TensorStream:
    def __init__(self, tokens, vocab_size, name):
        self.tokens, self.vocab_size, self.name = tokens.long(), vocab_size, name

    def __len__(self):
        return self.tokens.numel()

    def read(self, begin, count):
        return self.tokens[begin:begin + count]


def open_data(spec, vocab_size):
    if spec.startswith("builtin"):
        opts = {}
        if ":" in spec:
            for kv in spec.split(":", 1)[1].split(","):
                k, v = kv.split("=")
                opts[k.strip()] = int(v)
        return ReverseTask(**opts)
    if spec.endswith(".bin"):
        with open(spec, "rb") as f:
            raw = f.read()
        if len(raw) % 2:
            raise UsageError("%s: odd byte length %d" % (spec, len(raw)))
        toks = torch.frombuffer(bytearray(raw), dtype=torch.int16).long() & 0xFFFF
        return TensorStream(toks, vocab_size or int(toks.max()) + 1, spec)
    if spec.endswith(".safetensors"):
        tensors, _ = st_load(spec)
        return TensorStream(tensors["tokens"].reshape(-1), vocab_size, spec)
    with open(spec, "rb") as f:
        raw = f.read()
    return TensorStream(torch.tensor(list(raw), dtype=torch.long), 256, spec)


class Sampler:
    def __init__(self, num_samples, batch, shuffle=False, seed=0):
        self.n, self.B = num_samples, batch
        self.shuffle, self.seed = shuffle, seed
        self._epoch, self._perm = -1, None

    def permutation(self, epoch):
        perm = list(range(self.n))
        if self.shuffle:
            rng = SplitMix64(self.seed, SHUFFLE_STREAM, epoch)
            for i in range(self.n - 1, 0, -1):
                j = rng.below(i + 1)
                perm[i], perm[j] = perm[j], perm[i]
        return perm

    def sample_at(self, p):
        if not self.shuffle:
            return p % self.n
        e = p // self.n
        if e != self._epoch:
            self._perm, self._epoch = self.permutation(e), e
        return self._perm[p % self.n]

    def step_indices(self, step):
        return [self.sample_at(step * self.B + i) for i in range(self.B)]


def get_samples(stream, block_size, indices):
    rows = torch.stack([stream.read(j * block_size, block_size + 1) for j in indices])
    return rows[:, :-1].contiguous(), rows[:, 1:].contiguous()


# --------------------------------------------------------------------------------------------
# DeepSpeed config: batch triangle, optimizer, scheduler, clipping

def load_config(path):
    with open(path) as f:
        text = f.read()
    # Strip // and /* */ comments outside strings (dscpp accepts them).
    out, i, n, in_str = [], 0, len(text), False
    while i < n:
        c = text[i]
        if in_str:
            out.append(c)
            if c == "\\" and i + 1 < n:
                out.append(text[i + 1])
                i += 1
            elif c == '"':
                in_str = False
        elif c == '"':
            in_str = True
            out.append(c)
        elif text.startswith("//", i):
            while i < n and text[i] != "\n":
                i += 1
            continue
        elif text.startswith("/*", i):
            i = text.find("*/", i + 2)
            i = n if i < 0 else i + 2
            continue
        else:
            out.append(c)
        i += 1
    return json.loads("".join(out))


def resolve_batch(cfg, world):
    """DeepSpeed's _set_batch_related_parameters for a given world size."""
    B = cfg.get("train_batch_size")
    b = cfg.get("train_micro_batch_size_per_gpu")
    g = cfg.get("gradient_accumulation_steps")
    B, b, g = (None if v == "auto" else v for v in (B, b, g))
    if B is not None and b is not None and g is not None:
        pass
    elif B is not None and b is not None:
        g = B // (b * world)
    elif B is not None and g is not None:
        b = B // (g * world)
    elif b is not None and g is not None:
        B = b * g * world
    elif B is not None:
        g, b = 1, B // world
    elif b is not None:
        g, B = 1, b * world
    else:
        raise UsageError("config gives neither train_batch_size nor train_micro_batch_size_per_gpu")
    if B != b * g * world or min(B, b, g) <= 0:
        raise UsageError("train_batch_size %s != micro %s * gas %s * world %d" % (B, b, g, world))
    return B, b, g


class ManualAdam(torch.optim.Optimizer):
    """DeepSpeed's Adam with bias_correction=False (torch.optim has no such switch)."""

    def __init__(self, params, lr, betas, eps, weight_decay, adamw, bias_correction):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))
        self.adamw, self.bias_correction = adamw, bias_correction

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            b1, b2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                st = self.state[p]
                if not st:
                    st["step"] = 0
                    st["m"] = torch.zeros_like(p)
                    st["v"] = torch.zeros_like(p)
                st["step"] += 1
                g = p.grad
                if not self.adamw and group["weight_decay"]:
                    g = g.add(p, alpha=group["weight_decay"])
                st["m"].mul_(b1).add_(g, alpha=1 - b1)
                st["v"].mul_(b2).addcmul_(g, g, value=1 - b2)
                bc1 = 1 - b1 ** st["step"] if self.bias_correction else 1.0
                bc2 = 1 - b2 ** st["step"] if self.bias_correction else 1.0
                denom = (st["v"].sqrt() / math.sqrt(bc2)).add_(group["eps"])
                update = st["m"] / bc1 / denom
                if self.adamw and group["weight_decay"]:
                    update = update.add(p, alpha=group["weight_decay"])
                p.add_(update, alpha=-group["lr"])


class Lion(torch.optim.Optimizer):
    def __init__(self, params, lr, betas, weight_decay):
        super().__init__(params, dict(lr=lr, betas=betas, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            b1, b2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                m = self.state[p].setdefault("m", torch.zeros_like(p))
                c = m.mul(b1).add(p.grad, alpha=1 - b1)
                p.mul_(1 - group["lr"] * group["weight_decay"])
                p.add_(torch.sign(c), alpha=-group["lr"])
                m.mul_(b2).add_(p.grad, alpha=1 - b2)


def make_optimizer(cfg, params):
    sec = cfg.get("optimizer") or {"type": "AdamW", "params": {}}
    kind = sec.get("type", "").lower()
    p = sec.get("params", {})
    if kind in ("adam", "adamw"):
        lr, betas = p.get("lr", 1e-3), tuple(p.get("betas", (0.9, 0.999)))
        eps, wd = p.get("eps", 1e-8), p.get("weight_decay", 0.0)
        adamw = kind == "adamw" or p.get("adam_w_mode", True)
        if p.get("bias_correction", True):
            cls = torch.optim.AdamW if adamw else torch.optim.Adam
            return cls(params, lr=lr, betas=betas, eps=eps, weight_decay=wd)
        return ManualAdam(params, lr, betas, eps, wd, adamw, False)
    if kind == "sgd":
        return torch.optim.SGD(params, lr=p.get("lr", 1e-3), momentum=p.get("momentum", 0.0),
                               dampening=p.get("dampening", 0.0),
                               weight_decay=p.get("weight_decay", 0.0),
                               nesterov=p.get("nesterov", False))
    if kind == "adagrad":
        return torch.optim.Adagrad(params, lr=p.get("lr", 1e-2), lr_decay=p.get("lr_decay", 0.0),
                                   weight_decay=p.get("weight_decay", 0.0),
                                   initial_accumulator_value=p.get("initial_accumulator_value", 0.0),
                                   eps=p.get("eps", 1e-10))
    if kind == "lion":
        return Lion(params, p.get("lr", 1e-3), tuple(p.get("betas", (0.9, 0.999))),
                    p.get("weight_decay", 0.0))
    raise UsageError("optimizer type %r is not implemented in gpt_reference.py" % sec.get("type"))


def make_schedule(cfg, base_lr):
    """Returns f(iteration) -> lr as DeepSpeed's lr_schedules.py, f(-1) = value at construction."""
    sec = cfg.get("scheduler")
    if not sec:
        return lambda it: base_lr
    kind, p = sec.get("type"), sec.get("params", {})
    warm = max(2, int(p.get("warmup_num_steps", 1000)))
    wtype = p.get("warmup_type", "log")

    def gamma_warmup(it):
        if wtype == "linear":
            return it / warm
        return math.log(it + 1) / math.log(warm)

    if kind in ("WarmupLR", "WarmupDecayLR"):
        lo = p.get("warmup_min_lr", 0.0)
        hi = p.get("warmup_max_lr")
        if hi is None:
            hi = base_lr if kind == "WarmupLR" else 0.001
        total = p.get("total_num_steps")

        def f(it):
            if it < 0:
                return lo
            if it < warm:
                g = gamma_warmup(it)
            elif kind == "WarmupLR":
                g = 1.0
            else:
                g = max(0.0, float(total - it) / float(max(1.0, total - warm)))
            return lo + (hi - lo) * g
        return f
    if kind == "WarmupCosineLR":
        total = p["total_num_steps"]
        min_ratio = p.get("warmup_min_ratio", 0.0)
        cos_min = p.get("cos_min_ratio", 0.0001)

        def f(it):
            if it < 0:
                return 0.0
            if it < warm:
                r = gamma_warmup(it)
                return base_lr * (min_ratio + r * (1.0 - min_ratio))
            progress = min(1.0, (it - warm + 1) / max(1, total - warm))
            r = (1 + math.cos(math.pi * progress)) / 2
            return base_lr * max(0.0, cos_min + (1.0 - cos_min) * r)
        return f
    raise UsageError("scheduler type %r is not implemented in gpt_reference.py" % kind)


# --------------------------------------------------------------------------------------------
# modes

def cmd_forward(args):
    model, _, _ = model_from_weights(args.weights, args)
    toks, _ = st_load(args.tokens)
    idx = toks["idx"].long()
    logits = model(idx)
    out = [("logits", logits.detach())]
    if "targets" in toks:
        loss = GPT.cross_entropy(logits, toks["targets"].long())
        out.insert(0, ("loss", loss.detach()))
        if args.grads:
            loss.backward()
            for name, p in model.named_parameters():
                out.append(("grad." + name, p.grad.detach()))
    st_save(args.out, out)


def batches(args, cfg, block_size, vocab_size):
    world = args.world_size
    B, b, g = resolve_batch(cfg, world)
    stream = open_data(args.data_spec, vocab_size)
    T = args.seq_len or getattr(stream, "block_size", None) or block_size
    if not T:
        raise UsageError("pass --seq-len (the block size T of the data contract)")
    n = (len(stream) - 1) // T
    if n < B:
        raise UsageError("%s has %d tokens: %d samples of T=%d, fewer than train_batch_size %d"
                         % (stream.name, len(stream), n, T, B))
    seed = args.seed if args.seed is not None else cfg.get("seed", 0)
    return stream, T, Sampler(n, B, args.shuffle, seed), (B, b, g, world)


def cmd_samples(args):
    cfg = load_config(args.config)
    stream, T, sampler, (B, _, _, _) = batches(args, cfg, None, args.vocab_size)
    idx, ins, tgs = [], [], []
    for s in range(args.steps):
        ind = sampler.step_indices(s)
        x, y = get_samples(stream, T, ind)
        idx.append(torch.tensor(ind, dtype=torch.long))
        ins.append(x)
        tgs.append(y)
    st_save(args.out, [("indices", torch.stack(idx)), ("inputs", torch.stack(ins)),
                       ("targets", torch.stack(tgs))])


def cmd_train(args):
    cfg = load_config(args.config)
    model, mcfg, meta = model_from_weights(args.weights, args)
    stream, T, sampler, (B, b, g, world) = batches(args, cfg, mcfg["block_size"],
                                                    mcfg["vocab_size"])
    params = [p for _, p in model.named_parameters()]
    opt = make_optimizer(cfg, params)
    base_lr = opt.param_groups[0]["lr"]
    schedule = make_schedule(cfg, base_lr)
    clip = float(cfg.get("gradient_clipping", 0.0))
    micro_count = g * world
    with open(args.out, "w") as out:
        for step in range(args.steps):
            lr = schedule(step - 1)
            for group in opt.param_groups:
                group["lr"] = lr
            opt.zero_grad(set_to_none=True)
            ind = sampler.step_indices(step)
            losses = []
            # Micro-step k of rank r holds positions [(k*world + r)*b, +b): iterate in that order.
            for m in range(micro_count):
                x, y = get_samples(stream, T, ind[m * b:(m + 1) * b])
                loss = GPT.cross_entropy(model(x), y)
                (loss / micro_count).backward()
                losses.append(loss.item())
            with torch.no_grad():
                norm = math.sqrt(sum(float(p.grad.double().pow(2).sum()) for p in params
                                     if p.grad is not None))
                if clip > 0:
                    coef = clip / (norm + 1e-6)
                    if coef < 1:
                        for p in params:
                            if p.grad is not None:
                                p.grad.mul_(coef)
            opt.step()
            rec = {"step": step + 1, "loss": sum(losses) / len(losses), "lr": lr,
                   "grad_norm": norm}
            out.write(json.dumps(rec) + "\n")
            out.flush()
    if args.out_weights:
        st_save(args.out_weights, [(n, p.detach().float()) for n, p in model.named_parameters()],
                {k: str(v) for k, v in mcfg.items()})


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="mode", required=True)
    for name in ("forward", "train", "samples"):
        p = sub.add_parser(name)
        p.add_argument("--out", required=True)
        p.add_argument("--threads", type=int, default=1)
        keys = ("vocab_size", "block_size", "n_layer", "n_head", "n_embd")
        for key in keys if name != "samples" else ("vocab_size",):
            p.add_argument("--" + key.replace("_", "-"), dest=key, type=int)
        if name in ("forward", "train"):
            p.add_argument("--weights", required=True)
        if name == "forward":
            p.add_argument("--tokens", required=True)
            p.add_argument("--grads", action="store_true")
        if name in ("train", "samples"):
            p.add_argument("--config", required=True)
            p.add_argument("--data-spec", required=True)
            p.add_argument("--steps", type=int, required=True)
            p.add_argument("--world-size", type=int, default=1)
            p.add_argument("--shuffle", action="store_true")
            p.add_argument("--seed", type=int)
            p.add_argument("--seq-len", type=int, help="T of the data contract (default: the "
                           "built-in task's block size, else the model's block_size)")
        if name == "train":
            p.add_argument("--out-weights")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    try:
        {"forward": cmd_forward, "train": cmd_train, "samples": cmd_samples}[args.mode](args)
    except (UsageError, KeyError, ValueError, OSError) as e:
        sys.stderr.write("gpt_reference.py %s: %s\n" % (args.mode, e))
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
