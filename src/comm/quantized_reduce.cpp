// Implements the quantized all-to-all reduce-scatter of quantized_reduce.h (NOTE [quantized
// reduce-scatter]).
#include "comm/quantized_reduce.h"

#include <ATen/ATen.h>

#include "comm/quantize.h"
#include "dscpp/error.h"

namespace dscpp::comm {

void quantized_reduce_scatter(const RingContext& ctx, const at::Tensor& output,
                              const at::Tensor& input, const std::vector<int64_t>& counts,
                              const std::vector<bool>& remote) {
  const int n = ctx.world_size, me = ctx.rank;
  const QuantFormat f = kGradientFormat;
  const auto off = offsets_of(counts);
  at::Tensor in = input.view({-1});
  auto chunk = [&](int m) { return in.narrow(0, off[m], counts[m]); };
  std::vector<c10::intrusive_ptr<c10d::Work>> sends, recvs;
  // What arrives: every other member's codes and scales of chunk `me`.
  std::vector<at::Tensor> codes(n), scales(n);
  const int64_t mine = counts[me];
  for (int m = 0; m < n; ++m) {
    if (m == me || mine == 0) continue;
    codes[m] = at::empty({code_bytes(mine, f)}, in.options().dtype(at::kChar));
    scales[m] = at::empty({quant_blocks(mine, f)}, in.options().dtype(at::kFloat));
    std::vector<at::Tensor> c{codes[m]}, s{scales[m]};
    recvs.push_back(ctx.backend.recv(c, m, ctx.tag_base));
    recvs.push_back(ctx.backend.recv(s, m, ctx.tag_base + 1));
  }
  // What leaves: chunk m, quantized, to member m.
  std::vector<at::Tensor> keep;  // alive until the sends complete
  for (int m = 0; m < n; ++m) {
    if (m == me || counts[m] == 0) continue;
    at::Tensor c = at::empty({code_bytes(counts[m], f)}, in.options().dtype(at::kChar));
    at::Tensor s = at::empty({quant_blocks(counts[m], f)}, in.options().dtype(at::kFloat));
    quantize(chunk(m), c, s, f);
    std::vector<at::Tensor> cv{c}, sv{s};
    sends.push_back(ctx.backend.send(cv, m, ctx.tag_base));
    sends.push_back(ctx.backend.send(sv, m, ctx.tag_base + 1));
    if (ctx.traffic) ctx.traffic->add(remote[m], static_cast<int64_t>(c.nbytes() + s.nbytes()));
    keep.push_back(c);
    keep.push_back(s);
  }
  auto wait_all = [&](std::vector<c10::intrusive_ptr<c10d::Work>>& works) {
    for (auto& w : works) {
      DSCPP_CHECK(w->wait(ctx.timeout), CommTimeout,
                  "point-to-point transfer did not complete "
                  "within ",
                  ctx.timeout.count(), " ms");
    }
  };
  wait_all(recvs);
  if (mine > 0) {
    // In member order, in fp32: this member's own chunk exactly, the others' as they arrived.
    at::Tensor acc = at::zeros({mine}, in.options().dtype(at::kFloat));
    for (int m = 0; m < n; ++m) {
      if (m == me) {
        acc.add_(chunk(me));
      } else {
        dequantize(codes[m], scales[m], acc, f, /*accumulate=*/true);
      }
    }
    output.view({-1}).copy_(acc);
  }
  wait_all(sends);
}

}  // namespace dscpp::comm
