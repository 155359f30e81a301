// Checkpoints offline.
//   dscpp checkpoint verify DIR [--tag T]: proves a checkpoint whole, as a load does before it
//     reads any state: the tag (DIR/latest's when none is given), its manifest, and every rank
//     file's size and CRC-32C (src/checkpoint/verify.h). Exit status 0 when whole; a damaged or
//     missing checkpoint is an error naming the files (exit status 2).
//   dscpp zero-to-fp32 DIR OUT.safetensors [--tag T]: the checkpoint verified, then consolidated
//     into whole fp32 weights under the model's parameter names (src/checkpoint/consolidate.h),
//     whatever world size and stage saved it.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <iostream>

#include "checkpoint/consolidate.h"
#include "checkpoint/verify.h"
#include "dscpp/safetensors.h"
#include "tools.h"

namespace dscpp::tools {

int checkpoint_main(int argc, char** argv) {
  CLI::App app{"dscpp checkpoint: inspect checkpoints offline"};
  app.require_subcommand(1);
  CLI::App* verify = app.add_subcommand("verify", "check a checkpoint's manifest, sizes and CRCs");
  std::string dir, tag;
  verify->add_option("dir", dir, "the folder save_checkpoint wrote into")->required();
  verify->add_option("--tag", tag, "the tag to check (default: the one DIR/latest names)");
  CLI11_PARSE(app, argc, argv);
  const checkpoint::Manifest m = checkpoint::verify(dir, tag);
  uint64_t bytes = 0;
  for (const auto& f : m.files) bytes += f.bytes;
  std::cout << fmt::format(
      "checkpoint {}/{}: whole ({} files, {} bytes; saved at world size {}, ZeRO stage {}, {}; "
      "{} parameters in {} groups)\n",
      dir, m.tag, m.files.size(), bytes, m.world_size, m.stage, m.dtype,
      [&] {
        size_t n = 0;
        for (const auto& g : m.groups) n += g.parameters.size();
        return n;
      }(),
      m.groups.size());
  return 0;
}

int zero_to_fp32_main(int argc, char** argv) {
  CLI::App app{
      "dscpp zero-to-fp32: whole fp32 weights from a checkpoint of any world size and stage"};
  std::string dir, out, tag;
  app.add_option("dir", dir, "the folder save_checkpoint wrote into")->required();
  app.add_option("out", out, "the safetensors file to write")->required();
  app.add_option("--tag", tag, "the tag to read (default: the one DIR/latest names)");
  CLI11_PARSE(app, argc, argv);
  const checkpoint::Manifest m = checkpoint::verify(dir, tag);
  const safetensors::TensorList tensors = checkpoint::consolidate_fp32(dir, m);
  const safetensors::FileDigest d = safetensors::save(
      out, tensors,
      {{"format", "pt"},
       {"source", dir + "/" + m.tag},
       {"global_steps", std::to_string(m.counters.value("global_steps", int64_t{0}))}});
  std::cout << fmt::format(
      "wrote {}: {} tensors, {} bytes (checkpoint {}/{}, saved at world size "
      "{}, ZeRO stage {})\n",
      out, tensors.size(), d.bytes, dir, m.tag, m.world_size, m.stage);
  return 0;
}

}  // namespace dscpp::tools
