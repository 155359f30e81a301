// Implements the ring reduce-scatter and all-gather declared in ring.h.
//
// Reduce-scatter, rank r, n ranks, chunk c = input chunk c: at step s (0..n-2) rank r sends its
// partial sum of chunk (r-1-s) mod n to rank r+1 and receives the partial sum of chunk
// (r-2-s) mod n from rank r-1, adding its own input chunk to it. After n-1 steps the chunk it
// received last is chunk r, summed over all ranks. Send and receive of a step are in flight at
// once; buffers alternate so the one being sent is never the one being received into.
#include "comm/ring.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "dscpp/error.h"

namespace dscpp::comm {
namespace {

int mod(int a, int n) { return ((a % n) + n) % n; }

void wait_both(const RingContext& ctx, c10::intrusive_ptr<c10d::Work>& a,
               c10::intrusive_ptr<c10d::Work>& b) {
  for (auto* w : {&a, &b}) {
    if (!*w) continue;
    bool ok = (*w)->wait(ctx.timeout);
    DSCPP_CHECK(ok, CommTimeout, "point-to-point transfer did not complete within ",
                ctx.timeout.count(), " ms");
  }
}

void accumulate(at::Tensor& acc, const at::Tensor& x, ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg: acc.add_(x); break;
    case ReduceOp::max: at::maximum_out(acc, acc, x); break;
    case ReduceOp::min: at::minimum_out(acc, acc, x); break;
  }
}

// out = received (op) mine, element-wise; out may alias mine.
void combine_into(at::Tensor& out, const at::Tensor& received, const at::Tensor& mine, ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg: at::add_out(out, received, mine); break;
    case ReduceOp::max: at::maximum_out(out, received, mine); break;
    case ReduceOp::min: at::minimum_out(out, received, mine); break;
  }
}

// Sends `out` to `to` and receives `in` from `from`, both in flight at once. Either may be empty
// (a zero-length chunk), in which case that side is skipped on both ends consistently because
// the chunk sizes are known to every rank.
void exchange(const RingContext& ctx, int to, int from, int tag, const at::Tensor& out,
              const at::Tensor& in) {
  c10::intrusive_ptr<c10d::Work> sw, rw;
  if (in.numel() > 0) {
    std::vector<at::Tensor> v{in};
    rw = ctx.backend.recv(v, from, tag);
  }
  if (out.numel() > 0) {
    std::vector<at::Tensor> v{out};
    sw = ctx.backend.send(v, to, tag);
    if (ctx.traffic) ctx.traffic->add(ctx.next_on_other_host, out.nbytes());
  }
  wait_both(ctx, sw, rw);
}

// One ring step: send `out` to the next rank, receive `in` from the previous one.
void exchange(const RingContext& ctx, int step, const at::Tensor& out, const at::Tensor& in) {
  exchange(ctx, mod(ctx.rank + 1, ctx.world_size), mod(ctx.rank - 1, ctx.world_size),
           ctx.tag_base + step, out, in);
}

}  // namespace

std::vector<int64_t> offsets_of(const std::vector<int64_t>& counts) {
  std::vector<int64_t> off(counts.size() + 1, 0);
  for (size_t i = 0; i < counts.size(); ++i) off[i + 1] = off[i] + counts[i];
  return off;
}

void ring_reduce_scatter(const RingContext& ctx, at::Tensor& output, const at::Tensor& input,
                         const std::vector<int64_t>& counts, ReduceOp op) {
  const int n = ctx.world_size, r = ctx.rank;
  auto off = offsets_of(counts);
  if (n == 1) {
    output.copy_(input);
    return;
  }
  // The ring runs piece by piece (piece j of every chunk at a time), so its two buffers stay
  // small whatever the chunk size: ZeRO reduce-scatters whole gradient buffers.
  const int64_t max_chunk = *std::max_element(counts.begin(), counts.end());
  const int64_t piece = std::min(max_chunk, kRingPieceElements);
  at::Tensor bufs[2] = {at::empty({piece}, input.options()), at::empty({piece}, input.options())};
  for (int64_t start = 0; start < max_chunk; start += piece) {
    // Piece `start` of chunk c: [start, start + piece) of it, clipped to its length.
    auto part = [&](const at::Tensor& t, int64_t base, int c) {
      const int64_t from = std::min(start, counts[c]);
      return t.narrow(0, base + from, std::min(piece, counts[c] - from));
    };
    at::Tensor sending = part(input, off[mod(r - 1, n)], mod(r - 1, n));  // own data first
    for (int s = 0; s < n - 1; ++s) {
      const int c = mod(r - 2 - s, n);
      at::Tensor mine = part(input, off[c], c);
      at::Tensor into = bufs[s % 2].narrow(0, 0, mine.numel());
      exchange(ctx, s, sending, into);
      if (s == n - 2) {
        // c == r: the result goes to output, which may alias input chunk r (in place); reading
        // chunk r and writing output element by element is safe either way.
        at::Tensor out = part(output, 0, r);
        combine_into(out, into, mine, op);
      } else {
        accumulate(into, mine, op);
      }
      sending = into;
    }
  }
  if (op == ReduceOp::avg) output.div_(n);
}

void tree_reduce_scatter(const RingContext& ctx, at::Tensor& output, const at::Tensor& input,
                         const std::vector<int64_t>& counts, ReduceOp op) {
  // NOTE [tree order]
  const int n = ctx.world_size, r = ctx.rank;
  DSCPP_CHECK(is_power_of_two(n), Error, "internal: a tree reduce-scatter over ", n, " ranks");
  if (n == 1) {
    output.copy_(input);
    return;
  }
  auto off = offsets_of(counts);
  // Piece by piece as the ring; at step 0 half the chunks travel at once, so a piece of each
  // is at most 1/(n/2) of the ring's. Chunk c is held after step 0 when c = r (mod 2), in slot
  // c / 2 of `acc`, and stays there as long as it is held.
  const int half = n / 2;
  const int64_t max_chunk = *std::max_element(counts.begin(), counts.end());
  const int64_t piece = std::max<int64_t>(1, std::min(max_chunk, kRingPieceElements / half));
  at::Tensor send = at::empty({half * piece}, input.options());
  at::Tensor recv = at::empty({half * piece}, input.options());
  at::Tensor acc = at::empty({half * piece}, input.options());
  for (int64_t start = 0; start < max_chunk; start += piece) {
    // Piece `start` of chunk c: [start, start + piece) of it, clipped to its length.
    auto length = [&](int c) { return std::min(piece, counts[c] - std::min(start, counts[c])); };
    auto part = [&](const at::Tensor& t, int64_t base, int c) {
      return t.narrow(0, base + std::min(start, counts[c]), length(c));
    };
    auto slot = [&](int c) { return acc.narrow(0, (c / 2) * piece, length(c)); };
    for (int k = 0, bit = 1; bit < n; ++k, bit <<= 1) {
      // Held now: the chunks c = r (mod bit). Those whose bit k differs from r's go to the
      // partner, who sends this rank's half in the same (increasing) order.
      int64_t ns = 0, nr = 0;
      for (int c = 0; c < n; ++c) {
        if (c % bit != r % bit) continue;
        const at::Tensor held = k == 0 ? part(input, off[c], c) : slot(c);
        if ((c & bit) != (r & bit)) {
          send.narrow(0, ns, held.numel()).copy_(held);
          ns += held.numel();
        } else {
          nr += held.numel();
        }
      }
      exchange(ctx, r ^ bit, r ^ bit, ctx.tag_base + k, send.narrow(0, 0, ns),
               recv.narrow(0, 0, nr));
      int64_t at = 0;
      for (int c = 0; c < n; ++c) {
        if (c % (2 * bit) != r % (2 * bit)) continue;
        at::Tensor into = slot(c);
        const at::Tensor got = recv.narrow(0, at, into.numel());
        at += into.numel();
        if (k == 0) {
          combine_into(into, got, part(input, off[c], c), op);
        } else {
          accumulate(into, got, op);
        }
      }
    }
    // output may alias input chunk r: this piece of it was read at step 0, later ones are not
    // written yet.
    part(output, 0, r).copy_(slot(r));
  }
  if (op == ReduceOp::avg) output.div_(n);
}

void ring_all_gather(const RingContext& ctx, at::Tensor& output, const at::Tensor& input,
                     const std::vector<int64_t>& counts) {
  auto off = offsets_of(counts);
  std::vector<at::Tensor> outputs;
  for (size_t c = 0; c < counts.size(); ++c) outputs.push_back(output.narrow(0, off[c], counts[c]));
  ring_all_gather(ctx, outputs, input);
}

void ring_all_gather(const RingContext& ctx, const std::vector<at::Tensor>& outputs,
                     const at::Tensor& input) {
  const int n = ctx.world_size, r = ctx.rank;
  if (outputs[r].data_ptr() != input.data_ptr()) outputs[r].copy_(input);
  for (int s = 0; s < n - 1; ++s) exchange(ctx, s, outputs[mod(r - s, n)], outputs[mod(r - s - 1, n)]);
}

void ring_broadcast(const RingContext& ctx, const at::Tensor& tensor, int root) {
  const int n = ctx.world_size, r = ctx.rank;
  const int next = mod(r + 1, n), prev = mod(r - 1, n);
  at::Tensor flat = tensor.view({-1});
  std::vector<c10::intrusive_ptr<c10d::Work>> sends;
  int step = 0;
  for (int64_t start = 0; start < flat.numel(); start += kRingPieceElements, ++step) {
    at::Tensor piece = flat.narrow(0, start, std::min(kRingPieceElements, flat.numel() - start));
    std::vector<at::Tensor> v{piece};
    if (r != root) {
      auto w = ctx.backend.recv(v, prev, ctx.tag_base + step % 2048);
      DSCPP_CHECK(w->wait(ctx.timeout), CommTimeout, "point-to-point transfer did not complete "
                  "within ", ctx.timeout.count(), " ms");
    }
    if (next != root) {
      sends.push_back(ctx.backend.send(v, next, ctx.tag_base + step % 2048));
      if (ctx.traffic) ctx.traffic->add(ctx.next_on_other_host, piece.nbytes());
    }
  }
  for (auto& w : sends) {
    DSCPP_CHECK(w->wait(ctx.timeout), CommTimeout, "point-to-point transfer did not complete "
                "within ", ctx.timeout.count(), " ms");
  }
}

}  // namespace dscpp::comm
