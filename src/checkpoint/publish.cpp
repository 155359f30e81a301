// Implements the save side of a checkpoint folder (publish.h).
#include "checkpoint/publish.h"

#include "dscpp/error.h"
#include "io/file_system.h"

namespace dscpp::checkpoint {

void check_tag(const std::string& tag) {
  DSCPP_CHECK(!tag.empty(), CheckpointError, "a checkpoint tag may not be empty");
  DSCPP_CHECK(tag.find('/') == std::string::npos && tag != "latest" && tag[0] != '.',
              CheckpointError, "checkpoint tag '", tag,
              "' cannot name a folder beside 'latest' (no '/', not 'latest', no leading '.')");
}

std::string begin_save(const std::string& dir, const std::string& tag, io::FileSystem* fsp) {
  io::FileSystem& fs = io::resolve(fsp);
  check_tag(tag);
  const std::string folder = dir + "/" + tag;
  DSCPP_CHECK(!fs.exists(folder + "/manifest.json"), CheckpointError, "'", folder,
              "' already holds a complete checkpoint; saving over it would leave no whole copy "
              "if the save failed. HINT: save under another tag, or remove that folder first");
  fs.create_dirs(folder);
  return folder;
}

void publish(const std::string& dir, const Manifest& m, io::FileSystem* fsp) {
  io::FileSystem& fs = io::resolve(fsp);
  check_tag(m.tag);
  const std::string text = m.to_json();
  fs.write_file_atomically(dir + "/" + m.tag + "/manifest.json", {{text.data(), text.size()}});
  const std::string latest = m.tag + "\n";
  fs.write_file_atomically(dir + "/latest", {{latest.data(), latest.size()}});
}

}  // namespace dscpp::checkpoint
