// MuonMatrices: which rank orthogonalises each weight matrix of a Muon run, and the exchange that
// gets each matrix there whole and its update back, at every ZeRO stage.
//
// NOTE [Muon across ranks]: Muon's update of a matrix is a function of the whole matrix
// (optim::muon_orthogonalize), but under ZeRO a rank's part is a flat range that cuts matrices
// anywhere. DeepSpeed 0.19.8 all-reduces a cut matrix's gradient to every rank holding a piece
// and orthogonalises it on each (stages 1-2), and refuses Muon with reduce_scatter at stage 3.
// Here each matrix has one owner, chosen from the ranks holding a piece of it (at stage 0 all of
// them) so that the iterations' flops are spread evenly: the largest matrices first, each to the
// holder with the least work so far (ties: the larger piece, then the lower rank). The plan
// depends only on the layout, so every rank computes the same one. A step:
//   1. every rank folds its pieces' gradients into their momentum (optim::Muon::fold_momentum:
//      element-wise, so the momentum is partitioned like any optimizer state);
//   2. the pieces held by ranks other than the owner travel to it (one all-gather with a count
//      per rank; nothing at stage 0, where every rank holds every matrix);
//   3. the owner orthogonalises the whole matrix and keeps the update of its own piece;
//   4. the updates of the others' pieces travel back (a second all-gather; at stage 0 each
//      owned matrix's update once, the owner taking its own from there too) and each rank sets
//      them (optim::Muon::set_update, views of the gathered buffer) before the optimizer steps
//      its part.
// The result is the same at every stage and world size: the same whole matrix goes through the
// same iteration. Both gathers hold every rank's contribution at once (at stage 0 every matrix's
// update, 4 bytes per matrix element, until the step has applied them).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "dscpp/comm.h"
#include "dscpp/optim.h"
#include "zero/strategy.h"

namespace dscpp::zero {

// DeepSpeed's rule (deepspeed.set_optimizer_flags): a parameter takes Muon's update when it has
// at least 2 dimensions and its name contains neither "embed" nor "lm_head" (any case).
bool takes_muon(const std::string& name, const std::vector<int64_t>& shape);

class MuonMatrices {
 public:
  // `groups`: the strategy's checkpoint groups (names, shapes, layout and where this rank's part
  // of each lies); `replicated`: every rank holds every group whole (stage 0).
  MuonMatrices(const std::vector<CheckpointGroup>& groups, bool replicated,
               comm::Communicator& comm);

  // [offset, length) of this rank's matrix elements in its optimizer buffer (optim::Muon's).
  std::vector<std::pair<int64_t, int64_t>> local_ranges() const;
  // Matrices of the model, and how many this rank orthogonalises.
  int64_t num_matrices() const { return static_cast<int64_t>(matrices_.size()); }
  int64_t num_owned() const;

  // Steps 1-4 of NOTE [Muon across ranks] for this step: `parts` hold the averaged gradients
  // (optimizer-buffer offsets), `grad_scale` divides them (unscale and clip). A collective:
  // every rank calls it at the same step.
  void prepare_step(optim::Muon& muon, const std::vector<Part>& parts, double grad_scale);

 private:
  // Elements [first, first + length) of a matrix, at `offset` in rank `rank`'s optimizer buffer;
  // `slot`: where step 2 puts it in the gathered buffer (-1: it stays, its rank owns the matrix
  // or every rank holds the whole matrix).
  struct Piece {
    int rank;
    int64_t first, length, offset;
    int64_t slot = -1;
  };
  struct Matrix {
    std::string name;
    int64_t rows = 0, cols = 0;
    int owner = 0;
    std::vector<Piece> pieces;  // by rank
    // Step 4: the elements the other holders need, sorted disjoint [first, first + length), and
    // where they start in the gathered buffer.
    std::vector<std::pair<int64_t, int64_t>> wanted;
    int64_t back_slot = 0;
  };

  // Where step 4 puts piece p of m in the gathered buffer; -1 when no other rank needs it.
  static int64_t back_position(const Matrix& m, const Piece& p);

  comm::Communicator& comm_;
  int rank_, world_;
  std::vector<Matrix> matrices_;
  std::vector<int64_t> to_owner_counts_;  // elements each rank sends in step 2
  std::vector<int64_t> back_counts_;      // and in step 4
};

}  // namespace dscpp::zero
