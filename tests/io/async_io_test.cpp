// AsyncIo: every backend moves the bytes it is asked to (in pieces, with several requests in
// flight), refuses unaligned requests at once, and reports failures from wait() with the file
// and range named; FaultAsyncIo injects what the offload tests need. Also the POSIX file
// system's atomic write clearing what killed writers left.
#include "dscpp/async_io.h"

#include <gtest/gtest.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <numeric>
#include <thread>

#include "dscpp/error.h"
#include "dscpp/file_system.h"
#include "support/errors.h"
#include "support/fault_async_io.h"
#include "support/temp_dir.h"

namespace dscpp::io {
namespace {

using testing::error_of;
using testing::TempDir;

// Expects `stmt` to throw E whose message contains `text`.
#define EXPECT_THROW_MSG(stmt, E, text) \
  EXPECT_NE(error_of<E>([&] { stmt; }).find(text), std::string::npos)

void fill(AlignedBuffer& b, unsigned seed) {
  auto* p = static_cast<uint32_t*>(b.data());
  for (size_t i = 0; i < b.size() / 4; ++i) p[i] = static_cast<uint32_t>(i * 2654435761u + seed);
}

struct Backend {
  const char* name;
  AioBackend backend;
  AioOptions options;
};

class AsyncIoTest : public ::testing::TestWithParam<Backend> {};

TEST_P(AsyncIoTest, WritesAndReadsBackManyRequestsInPiecesAtOnce) {
  TempDir dir;
  auto io = make_async_io(GetParam().options, GetParam().backend);
  auto file = io->open(dir.file("swap"));
  // 6 requests of 5 blocks and a bit, written at once, then read back at once into other
  // buffers: pieces of several requests interleave on the workers.
  const size_t n = 5 * GetParam().options.block_size + 3 * kDirectAlignment;
  std::vector<AlignedBuffer> out, in;
  std::vector<IoHandle> works;
  for (unsigned i = 0; i < 6; ++i) {
    out.emplace_back(n);
    fill(out.back(), i);
    works.push_back(file->write(i * n, out.back().data(), n));
  }
  for (auto& w : works) w->wait();
  for (auto& w : works) EXPECT_TRUE(w->done());
  works.clear();
  for (unsigned i = 0; i < 6; ++i) {
    in.emplace_back(n);
    works.push_back(file->read((5 - i) * n, in.back().data(), n));
  }
  for (auto& w : works) w->wait();
  for (unsigned i = 0; i < 6; ++i)
    EXPECT_EQ(std::memcmp(in[i].data(), out[5 - i].data(), n), 0) << "request " << i;
}

TEST_P(AsyncIoTest, ReadingPastTheEndFailsFromWaitNamingTheFile) {
  TempDir dir;
  auto io = make_async_io(GetParam().options, GetParam().backend);
  auto file = io->open(dir.file("short"));
  AlignedBuffer b(4 * kDirectAlignment);
  file->write(0, b.data(), kDirectAlignment)->wait();
  IoHandle h = file->read(0, b.data(), b.size());
  EXPECT_THROW_MSG(h->wait(), IoError, dir.file("short"));
  EXPECT_THROW_MSG(h->wait(), IoError, "ends before byte");  // again: the same error
}

// Offsets past 4 GiB (a 2B-parameter model's swap files are 12 GiB per rank) travel intact:
// a sparse file, two blocks written beyond 2^32 and 2^33 bytes, read back.
TEST_P(AsyncIoTest, OffsetsBeyondFourGiBRoundTrip) {
  TempDir dir;
  auto io = make_async_io(GetParam().options, GetParam().backend);
  auto file = io->open(dir.file("sparse"));
  const uint64_t far[] = {(uint64_t{1} << 32) + 5 * kDirectAlignment,
                          (uint64_t{1} << 33) + 7 * kDirectAlignment};
  const size_t n = GetParam().options.block_size + kDirectAlignment;
  std::vector<AlignedBuffer> out, in;
  for (unsigned i = 0; i < 2; ++i) {
    out.emplace_back(n);
    fill(out.back(), 17 + i);
    file->write(far[i], out.back().data(), n)->wait();
  }
  for (unsigned i = 0; i < 2; ++i) {
    in.emplace_back(n);
    file->read(far[i], in.back().data(), n)->wait();
    EXPECT_EQ(std::memcmp(in[i].data(), out[i].data(), n), 0) << "offset " << far[i];
  }
}

TEST_P(AsyncIoTest, RefusesUnalignedRequestsAtOnce) {
  TempDir dir;
  auto io = make_async_io(GetParam().options, GetParam().backend);
  auto file = io->open(dir.file("f"));
  AlignedBuffer b(2 * kDirectAlignment);
  EXPECT_THROW_MSG(file->write(100, b.data(), kDirectAlignment), IoError, "aligned to 4096");
  EXPECT_THROW_MSG(file->write(0, b.data(), 100), IoError, "aligned to 4096");
  EXPECT_THROW_MSG(file->read(0, static_cast<char*>(b.data()) + 8, kDirectAlignment), IoError,
                   "aligned to 4096");
}

AioOptions small_blocks(int threads, int depth, bool single_submit, bool overlap) {
  AioOptions o;
  o.block_size = 64 << 10;
  o.thread_count = threads;
  o.queue_depth = depth;
  o.single_submit = single_submit;
  o.overlap_events = overlap;
  return o;
}

INSTANTIATE_TEST_SUITE_P(
    Backends, AsyncIoTest,
    ::testing::Values(Backend{"uring", AioBackend::automatic, small_blocks(1, 8, false, true)},
                      Backend{"uring_2threads_single_submit_no_overlap", AioBackend::automatic,
                              small_blocks(2, 4, true, false)},
                      Backend{"threads", AioBackend::threads, small_blocks(3, 1, false, true)}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(AsyncIo, DescribesItsBackend) {
  EXPECT_NE(make_async_io({}, AioBackend::threads)->describe().find("pread/pwrite threads"),
            std::string::npos);
}

TEST(AsyncIo, RefusesABlockSizeThatIsNotAligned) {
  AioOptions o;
  o.block_size = 1000;
  EXPECT_THROW_MSG(make_async_io(o), IoError, "aio.block_size 1000");
}

TEST(AsyncIo, OpeningInAMissingFolderNamesThePath) {
  TempDir dir;
  auto io = make_async_io({});
  EXPECT_THROW_MSG(io->open(dir.file("no/such/file")), IoError, dir.file("no/such/file"));
}

TEST(FaultAsyncIo, InjectsEachFaultFromWait) {
  TempDir dir;
  AlignedBuffer b(4 * kDirectAlignment);
  auto with = [&](AioFault f) {
    return std::make_unique<FaultAsyncIo>(f, make_async_io({}, AioBackend::threads));
  };
  {
    auto io = with({AioFault::Kind::fail_write, 2});
    auto file = io->open(dir.file("a"));
    file->write(0, b.data(), b.size())->wait();
    EXPECT_THROW_MSG(file->write(0, b.data(), b.size())->wait(), IoError, "Input/output error");
    EXPECT_EQ(io->injected(), 1);
  }
  {
    auto io = with({AioFault::Kind::short_write, 1});
    auto file = io->open(dir.file("b"));
    EXPECT_THROW_MSG(file->write(0, b.data(), b.size())->wait(), IoError,
                     "only 8192 bytes were written");
  }
  {
    auto io = with({AioFault::Kind::disk_full, 1, 3 * kDirectAlignment});
    auto file = io->open(dir.file("c"));
    file->write(0, b.data(), 2 * kDirectAlignment)->wait();
    EXPECT_THROW_MSG(file->write(0, b.data(), 2 * kDirectAlignment)->wait(), IoError,
                     "No space left on device");
  }
  {
    auto io = with({AioFault::Kind::fail_read, 1});
    auto file = io->open(dir.file("d"));
    file->write(0, b.data(), b.size())->wait();
    EXPECT_THROW_MSG(file->read(0, b.data(), b.size())->wait(), IoError, dir.file("d"));
  }
  {
    AioFault slow{AioFault::Kind::slow};
    slow.delay_ms = 150;
    auto io = with(slow);
    auto file = io->open(dir.file("e"));
    const auto t0 = std::chrono::steady_clock::now();
    IoHandle h = file->write(0, b.data(), b.size());
    EXPECT_FALSE(h->done());
    h->wait();
    EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(150));
  }
}

// A writer killed between creating its temporary file and renaming it (the fault suite's kill
// inside a checkpoint save) leaves NAME.tmp.PID.N; the next atomic write of NAME removes it,
// and only it: another path's temporaries belong to that path's writer.
TEST(FileSystem, AtomicWriteClearsTheTemporariesOfKilledWritersOfThatPath) {
  TempDir dir;
  FileSystem& fs = default_file_system();
  for (const char* name : {"rank0.safetensors.tmp.4242.0", "rank0.safetensors.tmp.4243.7",
                           "rank1.safetensors.tmp.4244.0", "latest.tmp.4245.1"}) {
    const std::string junk = "partial";
    fs.write_file_atomically(dir.file(name), {{junk.data(), junk.size()}});
  }
  const std::string text = "whole";
  fs.write_file_atomically(dir.file("rank0.safetensors"), {{text.data(), text.size()}});
  auto names = fs.list_dir(dir.path());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"latest.tmp.4245.1", "rank0.safetensors",
                                             "rank1.safetensors.tmp.4244.0"}));
  EXPECT_EQ(fs.file_size(dir.file("rank0.safetensors")), text.size());
  EXPECT_TRUE(fs.list_dir(dir.file("missing")).empty());
}

// NOTE [direct writes]: a file written once goes around the page cache in aligned pieces, its
// last block padded and the file cut back: every length, split into appends of every kind, reads
// back exactly, on this disk and on tmpfs (/dev/shm, which refuses O_DIRECT on many kernels).
TEST(FileSystem, FilesWrittenOnceReadBackExactlyAtEveryLength) {
  TempDir dir;
  FileSystem& fs = default_file_system();
  std::vector<std::string> folders = {dir.path()};
  const std::string shm = "/dev/shm/dscpp_direct_test_" + std::to_string(::getpid());
  struct statfs st {};
  if (::statfs("/dev/shm", &st) == 0) {
    fs.create_dirs(shm);
    folders.push_back(shm);
  }
  const size_t piece = size_t{8} << 20;
  for (const std::string& folder : folders) {
    for (size_t n : {size_t{0}, size_t{1}, size_t{4095}, size_t{4096}, size_t{4097}, piece - 1,
                     piece, piece + 4096 + 3, 2 * piece + 17}) {
      std::vector<unsigned char> bytes(n);
      for (size_t i = 0; i < n; ++i) bytes[i] = static_cast<unsigned char>((i * 131 + n) % 251);
      const std::string path = folder + "/f" + std::to_string(n);
      // Appends of 1 byte, 5000 bytes and the rest, so pieces straddle the buffer's edges.
      fs.write_file_atomically(path, [&](WritableFile& f) {
        size_t at = 0;
        for (size_t len : {size_t{1}, size_t{5000}, n}) {
          const size_t take = std::min(len, n - at);
          if (take > 0) f.append(bytes.data() + at, take);
          at += take;
        }
      });
      ASSERT_EQ(fs.file_size(path), n) << path;
      std::vector<unsigned char> back(n);
      if (n > 0) fs.open_for_read(path)->pread(0, back.data(), n);
      EXPECT_TRUE(back == bytes) << path;
      fs.remove_file(path);
    }
  }
  if (folders.size() > 1) std::filesystem::remove_all(shm);
}

}  // namespace
}  // namespace dscpp::io
