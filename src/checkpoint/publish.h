// The save side of a checkpoint folder (docs/checkpoint.md, "Atomic and durable"): a tag's
// folder is prepared before any rank writes, and published (manifest, then `latest`) only after
// every rank's file is durable, so a crash at any point leaves `latest` naming a complete
// checkpoint and never damages an earlier one.
#pragma once

#include <string>

#include "checkpoint/manifest.h"

namespace dscpp::io {
class FileSystem;
}

namespace dscpp::checkpoint {

// A tag names a folder: not empty, no '/', not "latest", not starting with '.'. Throws
// CheckpointError saying which rule it breaks.
void check_tag(const std::string& tag);

// Where a save writes, and whether it replaces a complete checkpoint.
struct SaveFolder {
  std::string path;       // DIR/TAG
  bool replaced = false;  // TAG held a complete checkpoint that `latest` does not name
};

// Prepares DIR/TAG for a save: checks the tag, refuses the tag `latest` names when its folder
// holds a complete checkpoint (DeepSpeed overwrites it in place, which is how a crash during save
// destroys the only copy), and creates the folder. A complete checkpoint under a tag `latest`
// does not name (a save whose update of `latest` a crash cut off, which a resumed run then saves
// again; or an earlier run's) is replaced: its manifest is removed first (and the directory
// synced), so a crash while writing leaves an unfinished folder, never a manifest over other
// files. Every rank may call it at once. Throws CheckpointError, or IoError naming the path when
// the folder cannot be made.
SaveFolder begin_save(const std::string& dir, const std::string& tag, io::FileSystem* fs = nullptr);

// Removes from `folder` the rank files of a save at another world size than `world_size`, and
// their temporary files (NAME.tmp.PID.N, left by a writer that was killed): a job restarted on
// fewer hosts saves the same tag again under other names, and nobody writes those any more.
// Files of this world size are left to their writers (each clears its own temporary files).
// Call it on one rank, after begin_save.
void clear_other_world_sizes(const std::string& folder, int world_size,
                             io::FileSystem* fs = nullptr);

// Completes a save once every file `m` lists is durable: writes DIR/TAG/manifest.json, then
// replaces DIR/latest with the tag, each atomically (temporary file, fsync, rename, directory
// fsync). If it throws (IoError), `latest` still names the previous checkpoint.
void publish(const std::string& dir, const Manifest& m, io::FileSystem* fs = nullptr);

}  // namespace dscpp::checkpoint
