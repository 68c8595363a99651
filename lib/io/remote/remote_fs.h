// Internal: the storage seam's FileSystem for http://, https:// and s3://
// addresses (include/shardkit/filesystem.h), on ObjectStore.
//
//  - OpenForRead: HEAD for the size; ReadAt = ranged GETs (clamped to the size);
//    no Map (callers read by ranges). ReadFile: one GET.
//  - NewWritableFile: http: the bytes are kept in memory and PUT at Close();
//    s3: once 16 MiB have been appended a multipart upload starts and each
//    full 16 MiB part is uploaded as it fills (one part in memory), the last
//    at Close(), which completes it; a smaller file is one PUT at Close(). The
//    object appears whole at Close() or not at all: a failed or dropped file
//    aborts its multipart upload. Convert writes remote outputs through a
//    local staging directory and uploads each finished file this way
//    (io/upload_staging.h).
//  - Publish(staged, final): copies the staged object to the final key (GET +
//    PUT) and removes the staged one; both must be remote.
//  - Stat: HEAD; on s3 a key that is no object but a prefix of some is a directory.
//  - ListDir (s3 only): ListObjectsV2 under "dir/", folded to direct children.
//  - MakeDirs, SyncDir, SyncTree: nothing to do (no directories, nothing to sync).
//  - Rename: kUnsupported.
// No message holds a secret (http_client.h, s3.h).
//
// The scheme registry (FileSystemFor) knows "http", "https" and "s3" once
// RegisterRemoteFileSystems() has run; FileSystemFor runs it on its first call
// (no static initialiser: nothing remote happens in a process that never asks).
//
// Thread safety: as filesystem.h says; a process-wide store per S3 setting.
#pragma once

#include <memory>
#include <string>

#include "io/remote/object_store.h"
#include "shardkit/filesystem.h"

namespace shardkit::remote {

// A FileSystem over `store` (shared: its connection pool is reused).
std::shared_ptr<FileSystem> NewRemoteFileSystem(std::shared_ptr<ObjectStore> store);

// The process's FileSystem for remote addresses with the environment's S3
// settings (the same object while AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID,
// AWS_PROFILE and AWS_REGION stay the same).
std::shared_ptr<FileSystem> DefaultRemoteFileSystem();

// Registers http, https and s3 with the scheme registry. Idempotent, thread-safe.
void RegisterRemoteFileSystems();

}  // namespace shardkit::remote
