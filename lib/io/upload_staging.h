// Internal: writing a dataset to a remote address (s3://..., an http(s):// PUT
// target) through a local staging directory.
//
// The writer writes local files as usual, through a FileSystem that wraps the
// local one: each file it creates through NewWritableFile as io::AtomicFile does
// (a shard, its .idx and .xxh3) is followed while it is written: a background
// thread (half the cores, 4 to 16 at once) reads the appended bytes back and
// hands them to the remote file under the same relative name below the remote
// root (on s3, parts go up as they fill); the remote file is closed (multipart
// complete, or the one PUT) once the writer publishes the staged file, and
// dropped (a multipart upload aborted) if the writer removes it unpublished.
// Files published without having been followed (an LMDB/HDF5 output) are
// uploaded whole once published.
// A manifest (*.manifest.json) or a part's record (*.part-I-of-N.json, written
// by `--part I/N` instead of the manifest) is uploaded last: its Publish waits
// for every upload of a published file, and fails (uploading nothing) when one failed, so a
// reader that sees a remote manifest, or `shardkit merge` that sees a part's
// record, sees complete shards. Files ending in ".partial" (the resumable
// writers' journals) and ".lock" (a part's lock) stay local. Before the manifest, staged
// files that an earlier, interrupted run committed but did not upload
// (--resume) are uploaded too (those whose remote size differs).
// The staged copy is a cache, not the output: it is not made durable (no fsync of a
// staged file, no sync of the staging directory; the store's acknowledgement of the
// upload is the durable copy), except the journals and locks, which a --resume after a
// machine crash reads. Such a crash may tear a staged file; the wds journal records the
// checksums of each shard and of its .idx and .xxh3 files, so the resume refuses it.
//
// The staging directory is STAGING/shardkit-upload-<xxh3 of the remote root><tag>
// (STAGING: the caller's staging_dir, ConvertOptions::staging_dir, else /tmp; the
// library reads no environment: the CLI and Python fill it from
// $SHARDKIT_STAGING_DIR, else $TMPDIR; tag: "-part-I-of-N"
// for a part, so that parts on one machine never share one), so that --resume
// finds it; it is removed after a successful Finish() and kept after a
// failure. Uploads go through FileSystemFor(remote address): a remote
// WritableFile (remote_fs.h: multipart in parts as they are appended on s3,
// aborted on failure; one PUT for http).
//
// Thread safety: the FileSystem as filesystem.h says; Finish() once, by the
// thread that wrote.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "shardkit/filesystem.h"

namespace shardkit::io {

class UploadingFileSystem;

struct StagedOutput {
  std::string address;                   // the local address to write (the format prefix kept)
  std::shared_ptr<FileSystem> fs;        // pass as WriteOptions::filesystem
  std::shared_ptr<UploadingFileSystem> uploader;
  std::string remote;  // the remote address (the format prefix kept)
  bool fresh = false;  // the staging directory held nothing: no earlier run to resume from it
  // Waits for every upload; the first error. Removes the staging directory on success.
  Status Finish();
  // The remote address of a staged local path (unchanged when not below the staging root).
  std::string RemoteOf(const std::string& local_path) const;
  // After a failed write: the staging directory is removed when it holds nothing (the
  // writer refused before it wrote: nothing to resume); else it stays for --resume.
  void RemoveIfEmpty() const;
};

// True when the address (after an optional "format:" prefix) is a "scheme://"
// address other than file://.
bool IsRemoteOutput(std::string_view address);

// For an output address holding a "scheme://" part (after an optional
// "format:" prefix). `base` is the local FileSystem to wrap (null = local).
// `staging_dir` is STAGING above (empty: /tmp). `tag` is appended to the staging
// directory's name (a part's "-part-I-of-N").
Result<StagedOutput> StageRemoteOutput(std::string_view address, const std::shared_ptr<FileSystem>& base,
                                       std::string_view staging_dir, std::string_view tag = {});

}  // namespace shardkit::io
