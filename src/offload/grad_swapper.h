// GradSwapper: this rank's gradient shard on disk (zero::GradShard), for ZeRO-Infinity with both
// offloads on nvme, where the shard in memory would be the largest thing a rank holds (a 3B
// model in bf16 at 1 rank: 5.7 GiB of gradient shard, everything else on disk).
//
// NOTE [gradients on disk]: one file per rank, `<offload_optimizer.nvme_path>/
// dscpp_gradients_rank<r>_pid<p>.swp`, unlinked once open and reserved at set-up: the shard in
// the training dtype, element i at byte i * itemsize. It is cut into blocks of
// optim::kSquaresChunk elements (2 MiB in bf16), each assembled in an aligned buffer:
//   backward   each reduction's piece is added into the blocks it covers (a block is zeros in a
//              window's first backward and read back from disk in the later ones, from the
//              piece's end to its start, the block below read ahead meanwhile); a block is
//              written out the moment every element the reductions fill has arrived (the
//              reducer says which at set-up, expect()), so only the blocks being filled (about
//              two: reductions arrive from the end of the shard to its start) and the writes in
//              flight (up to kWritesInFlight) are in memory. In the window's last backward each
//              block's sum of squares is taken as it is written: the gradient norm without
//              reading the shard again, with the bits of optim::squared_norm over the shard in
//              memory (chunks of kSquaresChunk from its start, summed in order).
//   backward's end   every write is waited for; a failed one is rethrown (IoError naming the
//              file), and the engine drops the window on every rank.
//   step       the store reads the shard sub-group by sub-group, one ahead (read_ahead, read),
//              into two buffers that take turns.
// The arithmetic per element is the shard in memory's (dst.add_(piece, factor)); with a factor
// other than 1 (prescale_gradients, gradient_predivide_factor) the piece is added in one
// operation over a gathered copy (a transient tensor the size of the piece), since ATen rounds
// a * x + b in a vector's lanes differently from its scalar tail, and so the piece's cut points
// must be the ones memory would have. A window flushed before its boundary
// (flush_accumulation) took no sums in backward: squared_norm() reads the shard back once.
// Padding (elements no reduction fills) is zeros: written with its block, or never written
// (reserved blocks read as zeros).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <deque>
#include <exception>
#include <map>
#include <string>
#include <vector>

#include "dscpp/async_io.h"
#include "zero/grad_shard.h"

namespace dscpp::offload {

struct GradSwapperOptions {
  std::string path;  // the swap file (created, reserved, then unlinked)
  int64_t numel = 0;
  at::ScalarType dtype = at::kBFloat16;  // the training dtype
  // The longest read() the step asks for (the optimizer's sub_group_size, at most numel).
  int64_t read_elements = 0;
};

class GradSwapper final : public zero::GradShard {
 public:
  // Opens, reserves (IoError when the disk is too small) and unlinks the file.
  GradSwapper(io::AsyncIo& io, GradSwapperOptions options);
  ~GradSwapper() override;

  int64_t file_bytes() const { return file_bytes_; }
  // The file's bytes, and about the most bytes of buffers it holds (blocks being filled and
  // written, the two read buffers), for a shard of `numel` elements of `dtype` read
  // `read_elements` at a time (the estimate's).
  static int64_t file_bytes_for(int64_t numel, at::ScalarType dtype);
  static int64_t buffer_bytes_for(int64_t numel, at::ScalarType dtype, int64_t read_elements);
  const std::string& path() const { return o_.path; }

  // ----- zero::GradShard
  int64_t numel() const override { return o_.numel; }
  at::Tensor tensor() const override { return at::Tensor(); }
  void expect(int64_t pos, int64_t n) override;
  void begin_backward(bool final) override;
  void add(int64_t pos, const at::Tensor& piece, double factor) override;
  void end_backward() override;
  void zero() override;
  int64_t bytes() const override { return 0; }
  int64_t buffer_bytes() const override;
  void read_ahead(int64_t pos, int64_t n) override;
  at::Tensor read(int64_t pos, int64_t n) override;
  double squared_norm() override;
  std::string take_report() override;

 private:
  static constexpr int kWritesInFlight = 8;
  static constexpr int kBlocksFilling = 2;  // reductions arrive from the shard's end to its start
  static constexpr int kBuffersKept = kWritesInFlight + kBlocksFilling + 1;  // + one read ahead
  struct Block {
    io::AlignedBuffer buffer;
    int64_t missing = 0;  // elements the reductions still fill in this backward
  };
  struct Write {
    io::AlignedBuffer buffer;
    io::IoHandle handle;
  };
  struct Read {
    int64_t pos = -1, n = 0;
    io::IoHandle handle;
  };

  int64_t blocks() const { return static_cast<int64_t>(expected_.size()); }
  int64_t block_numel(int64_t b) const;
  uint64_t block_offset(int64_t b) const;  // in the file
  size_t block_bytes(int64_t b) const;
  at::Tensor block_view(const Block& blk, int64_t b) const;  // [block_numel(b)]
  // Block b, made ready to add into (zeros, or read back after the window's first backward).
  Block& open(int64_t b);
  // Fills `buffer` with block b as it stands before this backward's pieces: zeros, or read back.
  void load(int64_t b, void* buffer);
  // After the window's first backward: starts reading block b, the one expected next (reductions
  // come from the shard's end to its start), unless it is open, read ahead already, or empty.
  void read_block_ahead(int64_t b);
  // Waits for the read ahead (if any) and frees its buffer.
  void drop_read_ahead();
  // Elements [lo, hi) of the piece at [pos, ...) arrived in block b: counted, and the block
  // closed when complete.
  void arrived(int64_t b, int64_t lo, int64_t hi);
  // Block b is complete: its sum of squares (final backward) and its write.
  void close(int64_t b);
  // Forgets the blocks being filled (a backward that did not finish) and keeps the free buffers
  // to what one backward needs.
  void drop_open_blocks();
  io::AlignedBuffer take_buffer();
  // Waits for the oldest write, keeping its buffer and its error (the first one).
  void retire_oldest_write();
  void keep_error();
  // The aligned byte range covering elements [pos, pos + n).
  uint64_t first_byte(int64_t pos) const;
  size_t range_bytes(int64_t pos, int64_t n) const;

  GradSwapperOptions o_;
  size_t item_;
  std::unique_ptr<io::AsyncFile> file_;
  int64_t file_bytes_ = 0;
  std::vector<int64_t> expected_;  // [blocks] elements the reductions fill per backward
  std::vector<double> squares_;    // [blocks] sums of squares in the window's last backward
  bool squares_valid_ = false;     // squares_ are the shard's (a final backward ended well)
  std::map<int64_t, Block> open_;  // blocks being filled
  struct Ahead {
    int64_t block = -1;
    io::AlignedBuffer buffer;
    io::IoHandle handle;
  };
  Ahead ahead_;                 // the block read ahead in a window's later backwards
  std::vector<char> complete_;  // [blocks] closed in this backward
  std::deque<Write> writes_;    // in flight, oldest first
  std::vector<io::AlignedBuffer> free_;
  std::exception_ptr error_;  // the first failure of this backward
  bool fresh_ = true;         // the window's first backward: blocks start as zeros
  bool final_ = false;
  // The step's two read buffers, and the read each holds or is filling.
  io::AlignedBuffer reads_[2];
  Read pending_[2];
  int next_ = 0;  // the buffer the next read_ahead fills
  int64_t bytes_written_ = 0, bytes_read_ = 0;
  double wait_seconds_ = 0;
};

}  // namespace dscpp::offload
