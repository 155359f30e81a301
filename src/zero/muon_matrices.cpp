// MuonMatrices: the owner of each matrix and the two all-gathers of NOTE [Muon across ranks].
#include "zero/muon_matrices.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <cctype>
#include <numeric>
#include <optional>

#include "dscpp/error.h"

namespace dscpp::zero {

bool takes_muon(const std::string& name, const std::vector<int64_t>& shape) {
  if (shape.size() < 2) return false;
  std::string lower = name;
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return lower.find("embed") == std::string::npos && lower.find("lm_head") == std::string::npos;
}

namespace {

// The elements [first, first + length) of a gradient piece in the optimizer buffer, from the
// part that holds them.
at::Tensor grads_at(const std::vector<Part>& parts, int64_t offset, int64_t length,
                    const std::string& matrix) {
  for (const Part& part : parts) {
    if (offset < part.offset || offset + length > part.offset + part.numel()) continue;
    DSCPP_CHECK(part.grads.defined(), Error, "Muon: the gradient of ", matrix,
                " is on disk, which Muon does not read (check_supported refuses it)");
    return part.grads.narrow(0, offset - part.offset, length);
  }
  DSCPP_FAIL(Error, "internal: Muon: elements [", offset, ", ", offset + length, ") of ", matrix,
             " are in no part of this rank");
}

}  // namespace

MuonMatrices::MuonMatrices(const std::vector<CheckpointGroup>& groups, bool replicated,
                           comm::Communicator& comm)
    : comm_(comm), rank_(comm.rank()), world_(comm.world_size()) {
  for (const CheckpointGroup& g : groups) {
    const int64_t shard = g.layout.shard;
    for (size_t j = 0; j < g.names.size(); ++j) {
      if (!takes_muon(g.names[j], g.shapes[j])) continue;
      const auto [off, n] = g.layout.segments[j];
      if (n == 0) continue;
      Matrix m;
      m.name = g.names[j];
      m.rows = g.shapes[j][0];
      m.cols = n / m.rows;  // a conv filter [out, in, k...] as [out, in*k...], as DeepSpeed
      if (replicated) {
        for (int r = 0; r < world_; ++r) m.pieces.push_back({r, 0, n, g.part_offset + off});
      } else {
        for (int64_t r = off / shard; r * shard < off + n; ++r) {
          const int64_t lo = std::max(off, r * shard), hi = std::min(off + n, (r + 1) * shard);
          m.pieces.push_back(
              {static_cast<int>(r), lo - off, hi - lo, g.part_offset + lo - r * shard});
        }
      }
      matrices_.push_back(std::move(m));
    }
  }
  // Owners: the largest matrices first, each to the holder with the least work so far.
  auto cost = [](const Matrix& m) {
    return double(m.rows) * double(m.cols) * double(std::min(m.rows, m.cols));
  };
  std::vector<size_t> order(matrices_.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return cost(matrices_[a]) > cost(matrices_[b]); });
  std::vector<double> load(world_, 0.0);
  for (size_t i : order) {
    Matrix& m = matrices_[i];
    std::vector<int64_t> held(world_, 0);
    for (const Piece& p : m.pieces) held[p.rank] += p.length;
    int best = -1;
    for (int r = 0; r < world_; ++r) {
      if (held[r] == 0) continue;
      if (best < 0 || load[r] < load[best] || (load[r] == load[best] && held[r] > held[best]))
        best = r;
    }
    m.owner = best;
    load[best] += cost(m);
  }
  // What each step carries, rank by rank in matrix order, and where each piece lands.
  to_owner_counts_.assign(world_, 0);
  back_counts_.assign(world_, 0);
  for (Matrix& m : matrices_) {
    for (Piece& p : m.pieces) {
      if (p.rank == m.owner) continue;
      if (replicated) {
        m.wanted = {{0, m.rows * m.cols}};
      } else {
        p.slot = to_owner_counts_[p.rank];
        to_owner_counts_[p.rank] += p.length;
        m.wanted.emplace_back(p.first, p.length);
      }
    }
    std::sort(m.wanted.begin(), m.wanted.end());
    m.back_slot = back_counts_[m.owner];
    for (const auto& w : m.wanted) back_counts_[m.owner] += w.second;
  }
  // Slots relative to each rank's contribution, made absolute in the gathered buffers.
  std::vector<int64_t> to_owner_start(world_, 0), back_start(world_, 0);
  for (int r = 1; r < world_; ++r) {
    to_owner_start[r] = to_owner_start[r - 1] + to_owner_counts_[r - 1];
    back_start[r] = back_start[r - 1] + back_counts_[r - 1];
  }
  for (Matrix& m : matrices_) {
    m.back_slot += back_start[m.owner];
    for (Piece& p : m.pieces) {
      if (p.slot >= 0) p.slot += to_owner_start[p.rank];
    }
  }
}

std::vector<std::pair<int64_t, int64_t>> MuonMatrices::local_ranges() const {
  std::vector<std::pair<int64_t, int64_t>> out;
  for (const Matrix& m : matrices_) {
    for (const Piece& p : m.pieces) {
      if (p.rank == rank_) out.emplace_back(p.offset, p.length);
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

int64_t MuonMatrices::num_owned() const {
  return std::count_if(matrices_.begin(), matrices_.end(),
                       [this](const Matrix& m) { return m.owner == rank_; });
}

void MuonMatrices::prepare_step(optim::Muon& muon, const std::vector<Part>& parts,
                                double grad_scale) {
  const c10::AutoGradMode no_grad(false);
  const auto total = [](const std::vector<int64_t>& c) {
    return std::accumulate(c.begin(), c.end(), int64_t{0});
  };
  // 1. Momentum, piece by piece: u of this rank's pieces, by matrix (at most one piece each).
  std::vector<at::Tensor> u(matrices_.size());
  std::optional<at::TensorOptions> options;
  for (size_t i = 0; i < matrices_.size(); ++i) {
    for (const Piece& p : matrices_[i].pieces) {
      if (p.rank != rank_) continue;
      const at::Tensor g = grads_at(parts, p.offset, p.length, matrices_[i].name);
      const at::Tensor piece = muon.fold_momentum(p.offset, g, grad_scale);
      options = piece.options();
      // Kept for the owner's iteration or for step 2; at stage 0 a matrix another rank owns
      // only needs its momentum folded here.
      if (matrices_[i].owner == rank_ || p.slot >= 0) u[i] = piece;
    }
  }
  if (!options) {  // no matrix piece here: the buffers on the gradients' device all the same
    options = at::TensorOptions().dtype(at::kFloat);
    for (const Part& part : parts) {
      if (part.grads.defined()) options = part.grads.options().dtype(at::kFloat);
    }
  }
  // 2. The pieces of others' matrices to their owners.
  at::Tensor gathered;
  if (total(to_owner_counts_) > 0) {
    at::Tensor send = at::empty({to_owner_counts_[rank_]}, *options);
    int64_t at = 0;
    for (size_t i = 0; i < matrices_.size(); ++i) {
      for (const Piece& p : matrices_[i].pieces) {
        if (p.rank != rank_ || p.slot < 0) continue;
        send.narrow(0, at, p.length).copy_(u[i]);
        u[i] = at::Tensor();  // the owner has it now
        at += p.length;
      }
    }
    gathered = at::empty({total(to_owner_counts_)}, *options);
    comm_.all_gather(gathered, send, to_owner_counts_)->wait();
  }
  // 3. Orthogonalise the owned matrices; pack the others' pieces' updates, and keep the own
  // piece's unless it comes back in step 4 (stage 0: the whole matrix goes to every rank, and
  // the owner takes its own from there too, so no update is held twice).
  at::Tensor back_send = at::empty({back_counts_[rank_]}, *options);
  int64_t back_at = 0;
  for (size_t i = 0; i < matrices_.size(); ++i) {
    const Matrix& m = matrices_[i];
    if (m.owner != rank_) continue;
    const int64_t n = m.rows * m.cols;
    at::Tensor whole = u[i];
    if (whole.numel() != n) {
      whole = at::empty({n}, *options);
      for (const Piece& p : m.pieces) {
        whole.narrow(0, p.first, p.length)
            .copy_(p.rank == rank_ ? u[i] : gathered.narrow(0, p.slot, p.length));
      }
    }
    u[i] = at::Tensor();
    const at::Tensor update =
        optim::muon_orthogonalize(whole.view({m.rows, m.cols}), muon.ns_method()).reshape({-1});
    for (const Piece& p : m.pieces) {
      if (p.rank != rank_ || back_position(m, p) >= 0) continue;
      muon.set_update(p.offset,
                      p.length == n ? update : update.narrow(0, p.first, p.length).clone());
    }
    for (const auto& [first, length] : m.wanted) {
      back_send.narrow(0, back_at, length).copy_(update.narrow(0, first, length));
      back_at += length;
    }
  }
  // 4. The updates of this rank's pieces that others need, its own among them: views of the
  // gathered buffer, which the optimizer keeps until it has applied them.
  if (total(back_counts_) == 0) return;
  at::Tensor back = at::empty({total(back_counts_)}, *options);
  comm_.all_gather(back, back_send, back_counts_)->wait();
  back_send = at::Tensor();
  for (const Matrix& m : matrices_) {
    for (const Piece& p : m.pieces) {
      if (p.rank != rank_) continue;
      const int64_t pos = back_position(m, p);
      if (pos >= 0) muon.set_update(p.offset, back.narrow(0, pos, p.length));
    }
  }
}

int64_t MuonMatrices::back_position(const Matrix& m, const Piece& p) {
  int64_t pos = m.back_slot;
  for (const auto& [first, length] : m.wanted) {
    if (p.first >= first && p.first + p.length <= first + length) return pos + p.first - first;
    pos += length;
  }
  return -1;
}

}  // namespace dscpp::zero
