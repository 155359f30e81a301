// Implements the save side of a checkpoint folder (publish.h).
#include "checkpoint/publish.h"

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "checkpoint/verify.h"
#include "dscpp/error.h"
#include "dscpp/file_system.h"
#include "util/fault_inject.h"

namespace dscpp::checkpoint {

void check_tag(const std::string& tag) {
  DSCPP_CHECK(!tag.empty(), CheckpointError, "a checkpoint tag may not be empty");
  DSCPP_CHECK(tag.find('/') == std::string::npos && tag != "latest" && tag[0] != '.',
              CheckpointError, "checkpoint tag '", tag,
              "' cannot name a folder beside 'latest' (no '/', not 'latest', no leading '.')");
}

SaveFolder begin_save(const std::string& dir, const std::string& tag, io::FileSystem* fsp) {
  io::FileSystem& fs = io::resolve(fsp);
  check_tag(tag);
  SaveFolder out{dir + "/" + tag, false};
  const std::string manifest = out.path + "/manifest.json";
  if (fs.exists(manifest)) {
    const std::string latest = read_latest(dir, &fs);
    DSCPP_CHECK(latest != tag, CheckpointError, "'", out.path,
                "' already holds a complete checkpoint, the one 'latest' names; saving over it "
                "would leave no whole copy if the save failed. HINT: save under another tag");
    fs.remove_file(manifest);  // un-published first: a crash now leaves an unfinished folder
    fs.sync_dir(out.path);
    out.replaced = true;
  }
  fs.create_dirs(out.path);
  return out;
}

void clear_other_world_sizes(const std::string& folder, int world_size, io::FileSystem* fsp) {
  io::FileSystem& fs = io::resolve(fsp);
  for (const std::string& name : fs.list_dir(folder)) {
    int rank = -1, world = -1, end = 0;
    if (std::sscanf(name.c_str(), "rank%5d-of-%5d.safetensors%n", &rank, &world, &end) != 2 ||
        end == 0 || world == world_size || name.substr(0, end) != rank_file_name(rank, world)) {
      continue;
    }
    const std::string rest = name.substr(end);
    if (rest.empty() || rest.rfind(".tmp.", 0) == 0) fs.remove_file(folder + "/" + name);
  }
}

void publish(const std::string& dir, const Manifest& m, io::FileSystem* fsp) {
  io::FileSystem& fs = io::resolve(fsp);
  check_tag(m.tag);
  const std::string text = m.to_json();
  fs.write_file_atomically(dir + "/" + m.tag + "/manifest.json", {{text.data(), text.size()}});
  const std::string latest = m.tag + "\n";
  DSCPP_CHECK(!fault::point(fault::Phase::save), IoError, "writing '", dir,
              "/latest' failed: ", std::strerror(EIO));
  fs.write_file_atomically(dir + "/latest", {{latest.data(), latest.size()}});
}

}  // namespace dscpp::checkpoint
