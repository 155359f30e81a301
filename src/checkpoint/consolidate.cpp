// Implements consolidated fp32 weights (consolidate.h).
#include "checkpoint/consolidate.h"

#include <ATen/ATen.h>

#include "checkpoint/rank_files.h"

namespace dscpp::checkpoint {

safetensors::TensorList consolidate_fp32(const std::string& dir, const Manifest& m,
                                         io::FileSystem* fs) {
  RankFiles reader(dir, m, fs);
  safetensors::TensorList out;
  for (const Group& g : m.groups) {
    for (const ParamEntry& p : g.parameters) {
      at::Tensor values = at::empty({p.numel()}, at::kFloat);
      for (const SliceRead& r : reads_for(m, p.name, 0, p.numel())) {
        reader[r.rank].read(slice_tensor_name(g.name, "fp32"), r.position,
                            values.narrow(0, r.dst, r.numel));
      }
      out.emplace_back(p.name, values.view(p.shape));
    }
  }
  for (const ReplicatedEntry& e : m.replicated) {
    // In the dtype it was saved in, then floating point as fp32.
    const std::string name = replicated_tensor_name(e.name);
    at::Tensor t = at::empty(e.shape, reader[0].dtype(name));
    reader[0].read(name, 0, t);
    out.emplace_back(e.name, t.is_floating_point() ? t.to(at::kFloat) : t);
  }
  return out;
}

}  // namespace dscpp::checkpoint
