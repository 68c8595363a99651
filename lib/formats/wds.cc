// wds format: WebDataset tar shards.
//
// Write: pax (restricted) tar through libarchive, one shard per printf index,
// reproducible bytes, a DALI .idx per shard and a JSON manifest beside them.
// Read: our own strict scanner (formats/tar.h) over an mmap of each shard, so
// that fields are zero-copy views and every error names file and offset.
// The layout is documented in docs/formats-wds.md.
#include <archive.h>
#include <archive_entry.h>
#include <locale.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <charconv>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/file.h"
#include "core/paths.h"
#include "core/per_thread.h"
#include "formats/registry.h"
#include "formats/tar.h"
#include "formats/wds_index.h"
#include "formats/wds_shards.h"

namespace shardkit::formats {

namespace {

using json = nlohmann::json;

// ---------------------------------------------------------------------------
// Naming rules.

bool EndsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

std::string BaseOf(const std::string& path) {
  auto slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

std::string JoinDir(const std::string& dir, const std::string& name) {
  if (dir.empty() || dir == ".") return name;
  return dir + "/" + name;
}

// DALI's default index name: the archive path up to the first dot of its base
// name (a leading dot does not count), plus ".idx".
std::string IdxPathFor(const std::string& tar_path) {
  size_t base = tar_path.rfind('/');
  base = base == std::string::npos ? 0 : base + 1;
  size_t dot = tar_path.find('.', base + 1);
  return (dot == std::string::npos ? tar_path : tar_path.substr(0, dot)) + ".idx";
}

// The manifest of a write pattern: in the pattern's directory, named after the
// part of the base name before the '%' conversion ("%%" read as '%'), with
// trailing '-', '_' and '.' removed ("shards" when nothing is left), plus
// ".manifest.json". out/train-%06d.tar -> out/train.manifest.json.
std::string ManifestPathFor(const std::string& pattern) {
  std::string dir = io::DirName(pattern);
  std::string base = BaseOf(pattern);
  std::string prefix;
  for (size_t i = 0; i < base.size(); ++i) {
    if (base[i] != '%') {
      prefix += base[i];
      continue;
    }
    if (i + 1 < base.size() && base[i + 1] == '%') {
      prefix += '%';
      ++i;
      continue;
    }
    break;
  }
  while (!prefix.empty() && (prefix.back() == '-' || prefix.back() == '_' || prefix.back() == '.')) prefix.pop_back();
  if (prefix.empty()) prefix = "shards";
  std::string name = prefix + ".manifest.json";
  return pattern.find('/') == std::string::npos ? name : JoinDir(dir, name);
}

bool HasSpace(std::string_view s) {
  for (char c : s)
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f') return true;
  return false;
}

// ---------------------------------------------------------------------------
// Member names -> (key, extension), as the WebDataset reader splits them.

enum class NameKind { kField, kSkip };

// Classifies a tar member. Fields: *key and *ext are set. Skipped (counted):
// directories, top-level names starting with "__" (WebDataset metadata) and
// names whose base name starts with '.' (hidden files). Errors: links and
// devices (their bytes are not in the shard), regular files without an
// extension, unsafe keys ("..", absolute).
Result<NameKind> Classify(const tar::Member& m, const std::string& file, int64_t shard, std::string* key,
                          std::string* ext) {
  Location where{.file = file, .shard = shard, .offset = int64_t(m.header_offset)};
  if (m.type == '5' || m.type == 'D' || m.type == 'V') return NameKind::kSkip;
  std::string_view name = m.name;
  while (name.substr(0, 2) == "./") name.remove_prefix(2);
  if (m.type != '0') {
    const char* what = m.type == '1'   ? "a hard link"
                       : m.type == '2' ? "a symbolic link"
                       : m.type == '3' ? "a character device"
                       : m.type == '4' ? "a block device"
                       : m.type == '6' ? "a FIFO"
                                       : "of an unsupported type";
    return Status::Corrupt(fmt::format("member '{}' is {} (type '{}'); a shard must hold regular files "
                                       "(create it with `tar -h` to store the files links point to)",
                                       m.name, what, m.type),
                           where);
  }
  if (name.empty()) return NameKind::kSkip;
  size_t slash = name.rfind('/');
  std::string_view base = slash == std::string_view::npos ? name : name.substr(slash + 1);
  if (slash == std::string_view::npos && base.substr(0, 2) == "__") return NameKind::kSkip;
  if (!base.empty() && base.front() == '.') return NameKind::kSkip;
  size_t dot = base.find('.');
  if (dot == std::string_view::npos || dot + 1 == base.size())
    return Status::Corrupt(fmt::format("member '{}' has no extension: WebDataset members are named KEY.EXT, "
                                       "so its field cannot be told",
                                       m.name),
                           where);
  size_t split = (slash == std::string_view::npos ? 0 : slash + 1) + dot;
  *key = std::string(name.substr(0, split));
  *ext = paths::Lower(name.substr(split + 1));
  Status safe = paths::CheckSafeKey(*key);
  if (!safe.ok()) return Status::Corrupt(fmt::format("member '{}': {}", m.name, safe.message()), where);
  return NameKind::kField;
}

// ---------------------------------------------------------------------------
// Shard index: where each sample's members lie.

struct FieldRef {
  std::string ext;
  uint64_t offset = 0;  // of the data
  uint64_t size = 0;
};

struct SampleRef {
  std::string key;
  uint64_t offset = 0;  // of the first member's first header block
  std::vector<FieldRef> fields;  // in shard order
};

struct ShardIndex {
  std::string path;
  uint64_t file_size = 0;
  std::vector<SampleRef> samples;
  uint64_t skipped = 0;
  std::set<std::string> exts;
};

// Groups consecutive members with the same key into samples.
class SampleCursor {
 public:
  SampleCursor(const io::MappedFile& map, int64_t shard)
      : scan_(map.data(), map.size(), map.path()), file_(map.path()), shard_(shard) {}

  Result<bool> Next(SampleRef* out) {
    if (!have_pending_) {
      SK_ASSIGN_OR_RETURN(bool more, Pull());
      if (!more) return false;
    }
    out->key = std::move(pending_key_);
    out->offset = pending_header_;
    out->fields.clear();
    out->fields.push_back(std::move(pending_));
    have_pending_ = false;
    for (;;) {
      SK_ASSIGN_OR_RETURN(bool more, Pull());
      if (!more) return true;
      if (pending_key_ != out->key) return true;
      for (const auto& f : out->fields)
        if (f.ext == pending_.ext)
          return Status::Corrupt(fmt::format("field '{}' appears twice in sample '{}'", f.ext, out->key),
                                 Location{.file = file_, .shard = shard_, .offset = int64_t(pending_header_),
                                          .key = out->key});
      out->fields.push_back(std::move(pending_));
      have_pending_ = false;
    }
  }
  uint64_t skipped() const { return skipped_; }

 private:
  // Reads the next data member into pending_.
  Result<bool> Pull() {
    tar::Member m;
    for (;;) {
      auto r = scan_.Next(&m);
      if (!r.ok()) {
        Status s = std::move(r).take_status();
        s.At(Location{.shard = shard_});
        return s;
      }
      if (!*r) return false;
      std::string key, ext;
      SK_ASSIGN_OR_RETURN(NameKind kind, Classify(m, file_, shard_, &key, &ext));
      if (kind == NameKind::kSkip) {
        if (m.type == '0') ++skipped_;
        continue;
      }
      pending_key_ = std::move(key);
      pending_ = FieldRef{std::move(ext), m.data_offset, m.size};
      pending_header_ = m.header_offset;
      have_pending_ = true;
      return true;
    }
  }

  tar::Scanner scan_;
  std::string file_;
  int64_t shard_;
  bool have_pending_ = false;
  std::string pending_key_;
  FieldRef pending_;
  uint64_t pending_header_ = 0;
  uint64_t skipped_ = 0;
};

Result<std::shared_ptr<io::MappedFile>> MapShard(const std::string& path, int64_t shard) {
  auto m = io::MappedFile::Open(path);
  if (!m.ok()) {
    Status s = std::move(m).take_status();
    s.At(Location{.file = path, .shard = shard});
    return s;
  }
  return std::move(m).value();
}

Result<ShardIndex> ScanShard(const io::MappedFile& map, int64_t shard) {
  ShardIndex idx;
  idx.path = map.path();
  idx.file_size = map.size();
  SampleCursor cur(map, shard);
  for (;;) {
    SampleRef s;
    SK_ASSIGN_OR_RETURN(bool more, cur.Next(&s));
    if (!more) break;
    for (const auto& f : s.fields) idx.exts.insert(f.ext);
    idx.samples.push_back(std::move(s));
  }
  idx.skipped = cur.skipped();
  return idx;
}

// Loads a DALI v1.2 index and checks it against the mapped shard: offsets on
// block boundaries inside the file, a valid regular-file header with the same
// size before every member, names that classify like a scan would, and the
// end-of-archive block right after the last member. Any doubt: returns an
// error and the caller scans instead.
Result<ShardIndex> LoadIdx(const std::string& idx_path, const io::MappedFile& map, int64_t shard) {
  SK_ASSIGN_OR_RETURN(std::string text, io::ReadFile(idx_path));
  auto bad = [&](std::string why) { return Status::Corrupt(why, Location{.file = idx_path, .shard = shard}); };
  ShardIndex idx;
  idx.path = map.path();
  idx.file_size = map.size();
  size_t pos = 0;
  auto next_line = [&](std::string_view* line) {
    if (pos >= text.size()) return false;
    size_t nl = text.find('\n', pos);
    if (nl == std::string::npos) nl = text.size();
    *line = std::string_view(text).substr(pos, nl - pos);
    pos = nl + 1;
    return true;
  };
  std::string_view line;
  if (!next_line(&line) || line.substr(0, 5) != "v1.2 ") return bad("not a v1.2 index");
  auto digits = [](std::string_view t) {
    return !t.empty() && t.size() <= 19 && std::all_of(t.begin(), t.end(), [](char c) { return c >= '0' && c <= '9'; });
  };
  if (!digits(line.substr(5))) return bad("bad sample count");
  uint64_t n = std::stoull(std::string(line.substr(5)));
  uint64_t last_end = 0;
  while (next_line(&line)) {
    if (line.empty()) continue;
    std::vector<std::string_view> tok;
    size_t s = 0;
    while (s < line.size()) {
      size_t e = line.find(' ', s);
      if (e == std::string_view::npos) e = line.size();
      if (e > s) tok.push_back(line.substr(s, e - s));
      s = e + 1;
    }
    if (tok.empty() || tok.size() % 4 != 0) return bad("malformed line");
    SampleRef sample;
    for (size_t i = 0; i < tok.size(); i += 4) {
      uint64_t off = 0, size = 0;
      if (!digits(tok[i + 1]) || !digits(tok[i + 2])) return bad("bad offset or size");
      off = std::stoull(std::string(tok[i + 1]));
      size = std::stoull(std::string(tok[i + 2]));
      if (off < tar::kBlock || off % tar::kBlock != 0 || off > map.size() || size > map.size() - off)
        return bad("offset outside the shard");
      // Every byte before this member must be accounted for: it starts right
      // where the previous one ended, or the blocks between are its own pax /
      // long-name headers, which the scanner checks. (fuzz_dali_index found an
      // index listing only the last member trusted: the others were lost.)
      if (off - tar::kBlock < last_end) return bad("members overlap or are out of order");
      if (off - tar::kBlock != last_end) {
        tar::Scanner gap(map.data() + last_end, map.size() - last_end, map.path());
        tar::Member gm;
        auto r = gap.Next(&gm);
        if (!r.ok() || !*r || gm.data_offset + last_end != off || gm.size != size)
          return bad("the index skips members or bytes of the shard");
      }
      last_end = off + (size + tar::kBlock - 1) / tar::kBlock * tar::kBlock;
      const uint8_t* h = map.data() + off - tar::kBlock;
      uint64_t hsize = 0;
      char type = char(h[156]);
      if (!tar::ParseNumber(h + 124, 12, &hsize) || hsize != size || (type != '0' && type != '\0'))
        return bad("index does not match the member headers");
      // The name must be the member's own: it must equal the ustar name (prefix/name);
      // distrust escaped names (`tar --list` output, as wds2idx uses). A name the
      // ustar fields cannot hold (long, or replaced there by a pax record) cannot be
      // checked here, so such an index is not trusted and the shard is scanned:
      // fuzz_dali_index found an index whose unchecked non-ASCII name changed a
      // field's extension.
      std::string_view name = tok[i + 3];
      if (name.find('\\') != std::string_view::npos) return bad("escaped member name");
      {
        std::string ustar(reinterpret_cast<const char*>(h), strnlen(reinterpret_cast<const char*>(h), 100));
        if (std::memcmp(h + 257, "ustar\0", 6) == 0 && h[345] != 0)
          ustar = std::string(reinterpret_cast<const char*>(h + 345), strnlen(reinterpret_cast<const char*>(h + 345), 155)) +
                  "/" + ustar;
        if (ustar != name) return bad("index names do not match the member headers");
      }
      tar::Member m;
      m.name = std::string(name);
      m.type = '0';
      m.header_offset = off - tar::kBlock;
      std::string key, ext;
      auto kind = Classify(m, map.path(), shard, &key, &ext);
      if (!kind.ok()) return bad("index names a member a scan would refuse");
      if (*kind == NameKind::kSkip) {
        ++idx.skipped;
        continue;
      }
      if (!sample.fields.empty() && key != sample.key) return bad("components of one line have different keys");
      for (const auto& f : sample.fields)
        if (f.ext == ext) return bad("duplicate field");
      if (sample.fields.empty()) sample.key = key, sample.offset = off - tar::kBlock;
      idx.exts.insert(ext);
      sample.fields.push_back(FieldRef{std::move(ext), off, size});
    }
    if (!sample.fields.empty()) idx.samples.push_back(std::move(sample));
  }
  if (idx.samples.size() != n) return bad("sample count does not match the lines");
  // Nothing may follow the last indexed member but the end-of-archive blocks.
  if (last_end + tar::kBlock > map.size()) return bad("shard shorter than the index says");
  for (uint64_t i = 0; i < tar::kBlock; ++i)
    if (map.data()[last_end + i]) return bad("members follow the last indexed one");
  return idx;
}

// `owner` keeps `map` alive (the map itself, or a per-thread owner of it).
void FillSample(const io::MappedFile& map, const std::shared_ptr<const void>& owner, const SampleRef& ref,
                Sample* out) {
  out->clear();
  out->key = ref.key;
  for (const auto& f : ref.fields) out->set(f.ext, Bytes(owner, map.data() + f.offset, f.size));
}

// ---------------------------------------------------------------------------
// Streamed shards: `pipe:CMD`, a shard that is the standard output of a shell
// command (as WebDataset's `pipe:` URLs). It is read once, in order, while the
// command runs; nothing is mapped, so there is no random access.

constexpr std::string_view kPipe = "pipe:";

bool IsPipe(std::string_view path) { return path.substr(0, kPipe.size()) == kPipe; }

// The command `/bin/sh -c CMD`, its standard output on a pipe. The child leads
// a process group of its own, so that an early end (Close() before the end of
// the output, or destruction) stops the commands it started too.
class ChildStream {
 public:
  ChildStream(std::string address, int64_t shard) : address_(std::move(address)), shard_(shard) {}
  ~ChildStream() { Close(); }
  ChildStream(const ChildStream&) = delete;
  ChildStream& operator=(const ChildStream&) = delete;

  std::string_view command() const { return std::string_view(address_).substr(kPipe.size()); }
  Location Where(int64_t offset = -1) const { return Location{.file = address_, .shard = shard_, .offset = offset}; }

  Status Start() {
    std::string cmd(command());
    if (cmd.find_first_not_of(" \t") == std::string::npos)
      return Status::Invalid("'pipe:' needs a command, e.g. 'pipe:cat shard.tar'", Where());
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) return Status::FromErrno(errno, "cannot create a pipe", Where());
    posix_spawn_file_actions_t fa;
    posix_spawnattr_t attr;
    posix_spawn_file_actions_init(&fa);
    posix_spawnattr_init(&attr);
    posix_spawn_file_actions_adddup2(&fa, fds[1], STDOUT_FILENO);  // dup2 clears O_CLOEXEC
    // Own process group; SIGPIPE at its default even when this process ignores it
    // (Python does), so that a command writing to a closed pipe ends.
    sigset_t def, none;
    sigemptyset(&def);
    sigaddset(&def, SIGPIPE);
    sigemptyset(&none);
    posix_spawnattr_setsigdefault(&attr, &def);
    posix_spawnattr_setsigmask(&attr, &none);
    posix_spawnattr_setpgroup(&attr, 0);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK);
    const char* argv[] = {"sh", "-c", cmd.c_str(), nullptr};
    pid_t pid = -1;
    int err = ::posix_spawn(&pid, "/bin/sh", &fa, &attr, const_cast<char* const*>(argv), environ);
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&attr);
    ::close(fds[1]);
    if (err != 0) {
      ::close(fds[0]);
      return Status::FromErrno(err, fmt::format("cannot start command '{}'", cmd), Where());
    }
    pid_ = pid;
    fd_ = fds[0];
    return Status::OK();
  }

  // Reads up to n bytes; 0 only at the end of the output.
  Result<size_t> Read(uint8_t* p, size_t n) {
    for (;;) {
      ssize_t r = ::read(fd_, p, n);
      if (r >= 0) {
        pos_ += uint64_t(r);
        return size_t(r);
      }
      if (errno != EINTR)
        return Status::FromErrno(errno, fmt::format("cannot read the output of command '{}'", command()),
                                 Where(int64_t(pos_)));
    }
  }
  // Reads exactly n bytes; *got < n only at the end of the output.
  Status ReadFull(uint8_t* p, size_t n, size_t* got) {
    *got = 0;
    while (*got < n) {
      SK_ASSIGN_OR_RETURN(size_t r, Read(p + *got, n - *got));
      if (r == 0) break;
      *got += r;
    }
    return Status::OK();
  }
  uint64_t pos() const { return pos_; }

  // After the end of the output: waits for the command; an error unless it exited with status 0.
  Status Finish() {
    if (pid_ < 0) return exit_;
    ::close(fd_);
    fd_ = -1;
    int st = 0;
    pid_t r;
    while ((r = ::waitpid(pid_, &st, 0)) < 0 && errno == EINTR) {
    }
    pid_t pg = pid_;
    pid_ = -1;
    ::kill(-pg, SIGKILL);  // whatever it left running in its group (usually nothing: ESRCH)
    if (r < 0) {
      exit_ = Status::FromErrno(errno, fmt::format("cannot wait for command '{}'", command()), Where());
    } else if (WIFEXITED(st) && WEXITSTATUS(st) != 0) {
      exit_ = Status::IOError(fmt::format("command '{}' failed with exit status {} after {} bytes of output",
                                          command(), WEXITSTATUS(st), pos_),
                              Where());
    } else if (WIFSIGNALED(st)) {
      exit_ = Status::IOError(fmt::format("command '{}' was killed by signal {} ({}) after {} bytes of output",
                                          command(), WTERMSIG(st), strsignal(WTERMSIG(st)), pos_),
                              Where());
    }
    return exit_;
  }

  // Stops the command if it still runs (SIGTERM to its group, SIGKILL after
  // 200 ms) and reaps it. Never blocks longer than that.
  void Close() {
    if (fd_ >= 0) ::close(fd_), fd_ = -1;
    if (pid_ < 0) return;
    ::kill(-pid_, SIGTERM);
    int st = 0;
    for (int i = 0; i < 200; ++i) {
      pid_t r = ::waitpid(pid_, &st, WNOHANG);
      if (r == pid_ || (r < 0 && errno != EINTR)) break;
      if (i == 199) {
        ::kill(-pid_, SIGKILL);
        while (::waitpid(pid_, &st, 0) < 0 && errno == EINTR) {
        }
        break;
      }
      ::usleep(1000);
    }
    ::kill(-pid_, SIGKILL);
    pid_ = -1;
  }

 private:
  std::string address_;
  int64_t shard_;
  pid_t pid_ = -1;
  int fd_ = -1;
  uint64_t pos_ = 0;
  Status exit_;
};

// The header checksum of a tar block (the field counted as spaces), checked as
// unsigned or signed bytes, as tar writers differ.
bool TarChecksumOk(const uint8_t* h) {
  uint64_t stored = 0;
  if (!tar::ParseNumber(h + 148, 8, &stored)) return false;
  uint64_t usum = 0;
  int64_t ssum = 0;
  for (size_t i = 0; i < tar::kBlock; ++i) {
    uint8_t c = (i >= 148 && i < 156) ? ' ' : h[i];
    usum += c;
    ssum += int8_t(c);
  }
  return stored == usum || int64_t(stored) == ssum;
}

// The "size" record of a pax extended header, if any (the scanner checks the
// whole header again later).
bool PaxSize(const uint8_t* p, size_t n, uint64_t* size) {
  size_t pos = 0;
  bool found = false;
  while (pos < n) {
    size_t len = 0, i = pos;
    while (i < n && p[i] >= '0' && p[i] <= '9' && len < (1u << 20)) len = len * 10 + (p[i++] - '0');
    if (len == 0 || pos + len > n || i >= n || p[i] != ' ') return found;
    std::string_view rec(reinterpret_cast<const char*>(p) + i + 1, pos + len - i - 1);
    if (rec.substr(0, 5) == "size=") {
      uint64_t v = 0;
      auto [q, ec] = std::from_chars(rec.data() + 5, rec.data() + rec.size(), v);
      if (ec == std::errc() && q == rec.data() + rec.size() - 1 && *q == '\n') *size = v, found = true;
    }
    pos += len;
  }
  return found;
}

// The samples of one streamed shard, in order: members are read one at a time
// (with their extended headers) into a buffer of their own, which the tar
// scanner then checks exactly as it checks a mapped shard; the fields of a
// sample are views into those buffers. Memory: one sample plus one member.
class PipeShardCursor {
 public:
  PipeShardCursor(std::string address, int64_t shard) : address_(address), shard_(shard), child_(address, shard) {}

  // Starts the command on the first call. An error is sticky: every later call returns it again.
  Result<bool> Next(Sample* out) {
    if (!error_.ok()) return error_;
    if (!started_) {
      started_ = true;
      error_ = child_.Start();
      if (!error_.ok()) return error_;
    }
    auto r = NextSample(out);
    if (!r.ok()) {
      error_ = r.status();
    } else if (!*r && !exit_.ok()) {
      error_ = exit_;  // the archive was whole, but the command failed: after the last sample, not instead of it
      return error_;
    }
    return r;
  }

 private:
  Result<bool> NextSample(Sample* out) {
    if (!have_pending_) {
      SK_ASSIGN_OR_RETURN(bool more, Pull());
      if (!more) return false;
    }
    out->clear();
    out->key = std::move(pending_key_);
    out->set(pending_ext_, std::move(pending_data_));
    have_pending_ = false;
    for (;;) {
      SK_ASSIGN_OR_RETURN(bool more, Pull());
      if (!more || pending_key_ != out->key) return true;
      for (const auto& f : out->fields)
        if (f.ext == pending_ext_)
          return Status::Corrupt(fmt::format("field '{}' appears twice in sample '{}'", f.ext, out->key),
                                 Location{.file = address_, .shard = shard_, .offset = int64_t(pending_header_),
                                          .key = out->key});
      out->set(pending_ext_, std::move(pending_data_));
      have_pending_ = false;
    }
  }

  // A failure of the stream: when the output has ended, the command's exit
  // status is the first cause (`cat missing.tar` writes nothing and fails).
  Status Fail(Status s, bool output_ended) {
    if (output_ended) {
      Status exit = child_.Finish();
      if (!exit.ok()) return exit;
    }
    s.At(child_.Where());
    return s;
  }

  // Reads the next data member into pending_*; false after the end-of-archive
  // blocks and the end of the output, the command's exit status then in exit_.
  Result<bool> Pull() {
    if (done_) return false;
    for (;;) {
      const uint64_t start = child_.pos();
      auto buf = std::make_shared<std::vector<uint8_t>>();
      bool have_pax_size = false;
      uint64_t pax_size = 0;
      for (;;) {  // extended headers, then the member's own header and data
        size_t at = buf->size(), got = 0;
        buf->resize(at + tar::kBlock);
        uint8_t* h = buf->data() + at;
        SK_RETURN_IF_ERROR(child_.ReadFull(h, tar::kBlock, &got));
        if (got < tar::kBlock) {
          if (child_.pos() == 0)
            return Fail(Status::Corrupt(fmt::format("command '{}' wrote nothing: not a tar archive",
                                                    child_.command())),
                        true);
          return Fail(Status::Corrupt(got == 0 ? "missing end-of-archive blocks (truncated shard?)"
                                               : fmt::format("truncated tar header: {} bytes, 512 needed", got),
                                      Location{.offset = int64_t(child_.pos() - got)}),
                      true);
        }
        if (std::all_of(h, h + tar::kBlock, [](uint8_t c) { return c == 0; })) {
          if (at > 0)
            return Fail(Status::Corrupt("extended header not followed by a member", Location{.offset = int64_t(start)}),
                        false);
          SK_RETURN_IF_ERROR(ReadEnd());
          done_ = true;
          exit_ = child_.Finish();
          return false;
        }
        uint64_t size = 0;
        if (!TarChecksumOk(h) || !tar::ParseNumber(h + 124, 12, &size))
          return Fail(Status::Corrupt(fmt::format("bad tar header (the output of command '{}' is not a tar "
                                                  "archive, or is damaged)",
                                                  child_.command()),
                                      Location{.offset = int64_t(child_.pos() - tar::kBlock)}),
                      false);
        char type = char(h[156]);
        if (have_pax_size && type != 'x' && type != 'g') size = pax_size;
        uint64_t padded = (size + tar::kBlock - 1) / tar::kBlock * tar::kBlock;
        // Read as the bytes come: memory follows what the command wrote, never a size it declared.
        uint64_t want = padded;
        while (want > 0) {
          size_t chunk = size_t(std::min<uint64_t>(want, 1 << 20));
          size_t old = buf->size();
          buf->resize(old + chunk);
          SK_RETURN_IF_ERROR(child_.ReadFull(buf->data() + old, chunk, &got));
          if (got < chunk)
            return Fail(Status::Corrupt(fmt::format("member declares {} bytes but the output ends after {} "
                                                    "(truncated?)",
                                                    size, padded - want + got),
                                        Location{.offset = int64_t(start + at)}),
                        true);
          want -= chunk;
        }
        if (type == 'x') {
          uint64_t v = 0;
          if (PaxSize(buf->data() + at + tar::kBlock, size_t(size), &v)) have_pax_size = true, pax_size = v;
          continue;
        }
        if (type == 'g' || type == 'L' || type == 'K') continue;
        break;
      }
      // The whole member, closed by two zero blocks: the scanner's checks apply unchanged.
      buf->resize(buf->size() + 2 * tar::kBlock, 0);
      tar::Scanner scan(buf->data(), buf->size(), address_);
      tar::Member m;
      auto r = scan.Next(&m);
      if (!r.ok() || !*r) {
        Status s = r.ok() ? Status::Internal("member vanished") : std::move(r).take_status();
        if (s.where().offset >= 0) s.where().offset += int64_t(start);
        return Fail(std::move(s), false);
      }
      const uint64_t data_offset = m.data_offset;
      m.header_offset += start;
      std::string key, ext;
      SK_ASSIGN_OR_RETURN(NameKind kind, Classify(m, address_, shard_, &key, &ext));
      if (kind == NameKind::kSkip) continue;
      pending_key_ = std::move(key);
      pending_ext_ = std::move(ext);
      pending_header_ = m.header_offset;
      pending_data_ = Bytes(std::shared_ptr<const void>(buf), buf->data() + data_offset, m.size);
      have_pending_ = true;
      return true;
    }
  }

  // After a zero block: a second zero block or the end of the output ends the
  // archive; after that, only zero bytes may follow (blocking-factor padding).
  Status ReadEnd() {
    std::vector<uint8_t> b(64 << 10);
    for (bool first = true;; first = false) {
      size_t got = 0;
      SK_RETURN_IF_ERROR(child_.ReadFull(b.data(), first ? tar::kBlock : b.size(), &got));
      if (got == 0) return Status::OK();
      const uint64_t at = child_.pos() - got;
      for (size_t i = 0; i < got; ++i) {
        if (!b[i]) continue;
        if (first && got == tar::kBlock)
          return Status::Corrupt("a lone zero block inside the archive (damaged or concatenated tar)",
                                 child_.Where(int64_t(at)));
        return Status::Corrupt("trailing garbage after the end-of-archive blocks", child_.Where(int64_t(at + i)));
      }
    }
  }

  std::string address_;
  int64_t shard_;
  ChildStream child_;
  bool started_ = false;
  bool done_ = false;
  Status exit_;   // the command's, once the archive has ended
  Status error_;
  bool have_pending_ = false;
  std::string pending_key_, pending_ext_;
  Bytes pending_data_;
  uint64_t pending_header_ = 0;
};

// ---------------------------------------------------------------------------
// Reading.

class WdsReader : public SampleReader {
 public:
  explicit WdsReader(std::vector<std::string> paths) : paths_(std::move(paths)) {}

  Result<bool> Next(Sample* out) override {
    for (;;) {
      if (pipe_) {
        SK_ASSIGN_OR_RETURN(bool more, pipe_->Next(out));
        if (more) return true;
        pipe_.reset();  // the command has exited with status 0
        continue;
      }
      if (!cursor_) {
        if (next_ >= paths_.size()) return false;
        if (IsPipe(paths_[next_])) {
          pipe_ = std::make_unique<PipeShardCursor>(paths_[next_], int64_t(next_));
          ++next_;
          continue;
        }
        SK_ASSIGN_OR_RETURN(map_, MapShard(paths_[next_], int64_t(next_)));
        cursor_ = std::make_unique<SampleCursor>(*map_, int64_t(next_));
        ++next_;
      }
      SampleRef ref;
      SK_ASSIGN_OR_RETURN(bool more, cursor_->Next(&ref));
      if (!more) {
        cursor_.reset();
        map_.reset();
        continue;
      }
      FillSample(*map_, map_, ref, out);
      return true;
    }
  }

 private:
  std::vector<std::string> paths_;
  size_t next_ = 0;
  std::shared_ptr<io::MappedFile> map_;
  std::unique_ptr<SampleCursor> cursor_;
  std::unique_ptr<PipeShardCursor> pipe_;  // a `pipe:` shard being read; destroying it stops the command
};

class WdsRandomAccess : public RandomAccess {
 public:
  struct Shard {
    std::shared_ptr<io::MappedFile> map;
    std::shared_ptr<const ShardIndex> index;
    uint64_t first = 0;  // global index of its first sample
  };
  explicit WdsRandomAccess(std::vector<Shard> shards)
      : shards_(std::make_shared<std::vector<Shard>>(std::move(shards))), owner_(shards_) {
    for (auto& s : *shards_) {
      s.first = total_;
      total_ += s.index->samples.size();
    }
  }
  uint64_t size() const override { return total_; }
  Status Get(uint64_t i, Sample* out) const override {
    if (i >= total_)
      return Status::Invalid(fmt::format("sample index {} out of range (dataset has {})", i, total_),
                             Location{.index = int64_t(i)});
    auto it = std::upper_bound(shards_->begin(), shards_->end(), i,
                               [](uint64_t v, const Shard& s) { return v < s.first; });
    const Shard& s = *(it - 1);
    // The views' owner keeps every shard's mapping alive, through a control block of this
    // thread's own (lib/core/per_thread.h).
    FillSample(*s.map, owner_.Owner(), s.index->samples[i - s.first], out);
    return Status::OK();
  }

 private:
  std::shared_ptr<std::vector<Shard>> shards_;
  core::PerThreadViewOwner owner_;
  uint64_t total_ = 0;
};

class WdsDataset : public Dataset {
 public:
  const DatasetInfo& info() const override { return info_; }

  Result<std::unique_ptr<SampleReader>> NewReader() const override {
    return std::unique_ptr<SampleReader>(new WdsReader(paths_));
  }

  Result<std::shared_ptr<RandomAccess>> NewRandomAccess() const override {
    for (size_t i = 0; i < paths_.size(); ++i)
      if (IsPipe(paths_[i]))
        return Status::Unsupported(
            fmt::format("'{}' is a stream (the output of a command), readable in order only: it has no random "
                        "access by index; read it sequentially, or convert it to a format with random access "
                        "first (e.g. `shardkit convert '{}' out.lmdb`)",
                        paths_[i], info_.address),
            Location{.file = paths_[i], .shard = int64_t(i)});
    std::vector<WdsRandomAccess::Shard> shards;
    for (size_t i = 0; i < paths_.size(); ++i) {
      WdsRandomAccess::Shard s;
      SK_ASSIGN_OR_RETURN(s.map, MapShard(paths_[i], int64_t(i)));
      SK_ASSIGN_OR_RETURN(s.index, Index(i, *s.map));
      // A shard that changed size since it was indexed could SIGBUS a mapping.
      if (s.map->size() != s.index->file_size)
        return Status::Corrupt(fmt::format("shard changed size since it was indexed ({} -> {} bytes)",
                                           s.index->file_size, s.map->size()),
                               Location{.file = paths_[i], .shard = int64_t(i)});
      shards.push_back(std::move(s));
    }
    return std::shared_ptr<RandomAccess>(new WdsRandomAccess(std::move(shards)));
  }

  // The checksums of every shard's sidecar, concatenated; empty when no shard
  // has one; an error when only some have, or one disagrees with its shard.
  Result<std::vector<uint64_t>> RecordedChecksums() const override {
    std::vector<uint64_t> all;
    for (const auto& p : paths_)
      if (IsPipe(p)) return all;  // a streamed shard's sidecar cannot be fetched
    size_t with = 0;
    for (size_t i = 0; i < paths_.size(); ++i) {
      std::string sp = wds::SumsPath(paths_[i]);
      auto r = wds::ReadSums(sp);
      if (!r.ok() && r.status().code() == Code::kNotFound) {
        if (with > 0)
          return Status::NotFound("shard has no per-sample checksum file (" + BaseOf(sp) + ") but others have",
                                  Location{.file = paths_[i], .shard = int64_t(i)});
        continue;
      }
      if (!r.ok()) {
        Status s = std::move(r).take_status();
        s.At(Location{.shard = int64_t(i)});
        return s;
      }
      if (with != i)
        return Status::NotFound("earlier shards have no per-sample checksum file but this one has",
                                Location{.file = paths_[i], .shard = int64_t(i)});
      ++with;
      if (i < info_.shards.size() && r->size() != info_.shards[i].samples)
        return Status::Corrupt(fmt::format("{} holds {} checksums for {} samples", BaseOf(sp), r->size(),
                                           info_.shards[i].samples),
                               Location{.file = sp, .shard = int64_t(i)});
      all.insert(all.end(), r->begin(), r->end());
    }
    return all;
  }

  // The index of shard i: cached, else from its .idx when consistent, else a scan.
  Result<std::shared_ptr<const ShardIndex>> Index(size_t i, const io::MappedFile& map) const {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (indexes_[i] && indexes_[i]->file_size == map.size()) return indexes_[i];
    }
    std::shared_ptr<const ShardIndex> idx;
    std::string idx_path = IdxPathFor(paths_[i]);
    if (io::Exists(idx_path)) {
      auto r = LoadIdx(idx_path, map, int64_t(i));
      if (r.ok()) idx = std::make_shared<ShardIndex>(std::move(r).value());
    }
    if (!idx) {
      SK_ASSIGN_OR_RETURN(auto scanned, ScanShard(map, int64_t(i)));
      idx = std::make_shared<ShardIndex>(std::move(scanned));
    }
    std::lock_guard<std::mutex> lock(mu_);
    indexes_[i] = idx;
    return idx;
  }

  DatasetInfo info_;
  std::vector<std::string> paths_;
  mutable std::mutex mu_;
  mutable std::vector<std::shared_ptr<const ShardIndex>> indexes_;
};

Result<uint64_t> FileSize(const std::string& path, int64_t shard) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0)
    return errno == ENOENT ? Status::NotFound("shard does not exist", Location{.file = path, .shard = shard})
                           : Status::FromErrno(errno, "cannot stat shard", Location{.file = path, .shard = shard});
  if (!S_ISREG(st.st_mode))
    return Status::Invalid("shard is not a regular file", Location{.file = path, .shard = shard});
  return uint64_t(st.st_size);
}

Result<std::unique_ptr<Dataset>> OpenManifest(const std::string& path) {
  auto ds = std::make_unique<WdsDataset>();
  DatasetInfo& info = ds->info_;
  info.format = "wds";
  info.address = path;
  std::string unreadable;
  SK_ASSIGN_OR_RETURN(wds::Manifest m, wds::ReadManifest(path, &unreadable));
  if (!m.fields_error.empty()) unreadable = m.fields_error;
  if (!unreadable.empty()) return Status::Corrupt(fmt::format("bad manifest: {}", unreadable), Location{.file = path});
  info.num_samples = m.num_samples;
  info.class_names = std::move(m.class_names);
  info.fields = std::move(m.fields);
  info.shards = std::move(m.shards);
  uint64_t sum = 0;
  for (const auto& si : info.shards) sum += si.samples;
  if (sum != *info.num_samples)
    return Status::Corrupt(fmt::format("manifest says {} samples but its shards add up to {}", *info.num_samples, sum),
                           Location{.file = path});
  for (size_t i = 0; i < info.shards.size(); ++i) {
    const auto& si = info.shards[i];
    SK_ASSIGN_OR_RETURN(uint64_t size, FileSize(si.path, int64_t(i)));
    if (size != si.bytes)
      return Status::Corrupt(fmt::format("shard has {} bytes but the manifest says {}", size, si.bytes),
                             Location{.file = si.path, .shard = int64_t(i)});
    info.total_bytes += size;
    ds->paths_.push_back(si.path);
  }
  ds->indexes_.resize(ds->paths_.size());
  if (!ds->paths_.empty() && io::Exists(wds::SumsPath(ds->paths_[0]))) {
    info.sample_checksums = SampleChecksums::kList;
    info.sample_checksums_where = "a .xxh3 list beside each shard";
  }
  return std::unique_ptr<Dataset>(std::move(ds));
}

Result<std::unique_ptr<Dataset>> OpenWds(const std::string& path, const OpenOptions&) {
  if (EndsWith(path, ".manifest.json")) return OpenManifest(path);
  SK_ASSIGN_OR_RETURN(std::vector<std::string> paths, paths::ExpandBraces(path));
  auto ds = std::make_unique<WdsDataset>();
  DatasetInfo& info = ds->info_;
  info.format = "wds";
  info.address = path;
  ds->paths_ = paths;
  ds->indexes_.resize(paths.size());
  std::set<std::string> exts;
  uint64_t samples = 0, skipped = 0;
  size_t pipes = 0;
  for (size_t i = 0; i < paths.size(); ++i) {
    if (IsPipe(paths[i])) {
      // Not run here: a command may be a download, and runs once per reader.
      if (paths[i].find_first_not_of(" \t", kPipe.size()) == std::string::npos)
        return Status::Invalid("'pipe:' needs a command, e.g. 'pipe:cat shard.tar'",
                               Location{.file = paths[i], .shard = int64_t(i)});
      info.shards.push_back(ShardInfo{paths[i], 0, 0, "", "wds:" + paths[i]});
      ++pipes;
      continue;
    }
    SK_ASSIGN_OR_RETURN(uint64_t size, FileSize(paths[i], int64_t(i)));
    (void)size;
    SK_ASSIGN_OR_RETURN(auto map, MapShard(paths[i], int64_t(i)));
    SK_ASSIGN_OR_RETURN(auto idx, ds->Index(i, *map));
    exts.insert(idx->exts.begin(), idx->exts.end());
    samples += idx->samples.size();
    skipped += idx->skipped;
    info.shards.push_back(ShardInfo{paths[i], idx->samples.size(), idx->file_size, "", "wds:" + paths[i]});
    info.total_bytes += idx->file_size;
  }
  if (pipes == 0) {
    info.num_samples = samples;
    info.fields.assign(exts.begin(), exts.end());
  } else {
    // Sample count and fields are known only once the streams have been read.
    info.extra["access"] = "sequential: pipe: shards are streamed from a command, with no random access";
  }
  if (skipped) info.extra["skipped_members"] = std::to_string(skipped);
  if (!ds->paths_.empty() && io::Exists(wds::SumsPath(ds->paths_[0]))) {
    info.sample_checksums = SampleChecksums::kList;
    info.sample_checksums_where = "a .xxh3 list beside each shard";
  }
  return std::unique_ptr<Dataset>(std::move(ds));
}

// ---------------------------------------------------------------------------
// Writing.

// Makes libarchive's name conversion independent of the process locale: names
// are taken as UTF-8, and bytes that are not UTF-8 are stored as they are
// (libarchive then marks the entry "hdrcharset=BINARY").
class Utf8Locale {
 public:
  Utf8Locale() {
    static locale_t loc = [] {
      locale_t l = newlocale(LC_CTYPE_MASK, "C.UTF-8", locale_t(0));
      return l ? l : newlocale(LC_CTYPE_MASK, "C", locale_t(0));
    }();
    old_ = loc ? uselocale(loc) : locale_t(0);
  }
  ~Utf8Locale() {
    if (old_) uselocale(old_);
  }

 private:
  locale_t old_;
};

using IdxEntry = wds::IndexMember;

class WdsWriter : public SampleWriter {
 public:
  WdsWriter(std::string pattern, WriteOptions opts)
      : pattern_(std::move(pattern)),
        opts_(std::move(opts)),
        manifest_(ManifestPathFor(pattern_)),
        journal_(manifest_ + ".partial"),
        keep_state_(opts_.resume) {
    digest_ = XXH3_createState();
    XXH3_64bits_reset(digest_);
  }

  ~WdsWriter() override {
    if (!finished_) {
      AbortShard();
      if (!keep_state_) {
        for (const auto& p : committed_) ::unlink(p.c_str());
        if (owns_journal_) ::unlink(journal_.c_str());
      }
    }
    if (hash_) XXH3_freeState(hash_);
    if (digest_) XXH3_freeState(digest_);
  }

  static Result<std::unique_ptr<SampleWriter>> Make(const std::string& pattern, const WriteOptions& opts) {
    SK_RETURN_IF_ERROR(paths::CheckShardPattern(pattern));
    auto slash = pattern.rfind('/');
    if (slash != std::string::npos && pattern.substr(0, slash).find('%') != std::string::npos)
      return Status::Invalid(fmt::format("bad shard pattern '{}': the %d conversion must be in the file name, "
                                         "not in a directory",
                                         pattern));
    std::string first = paths::FormatShardPattern(pattern, 0);
    if (opts.wds.write_index && IdxPathFor(first) == IdxPathFor(paths::FormatShardPattern(pattern, 1)))
      return Status::Invalid(fmt::format("shard pattern '{}': DALI index names (base name up to its first dot, "
                                         "plus .idx) would be the same for every shard; put the %d before any "
                                         "dot in the file name or turn index writing off",
                                         pattern));
    if (opts.shard_size < 2 * tar::kBlock)
      return Status::Invalid(fmt::format("shard size {} is too small", opts.shard_size));
    auto w = std::make_unique<WdsWriter>(pattern, opts);
    bool resuming = opts.resume && io::Exists(w->journal_);
    if (!opts.overwrite && !resuming) {
      if (io::Exists(w->journal_))
        return Status::Exists("an interrupted write left its journal here: pass --resume to continue it, or "
                              "--overwrite to start over",
                              Location{.file = w->journal_});
      for (const std::string& p : {first, w->manifest_})
        if (io::Exists(p))
          return Status::Exists("output exists (pass --overwrite to replace it)", Location{.file = p});
    }
    std::string dir = io::DirName(first);
    if (!io::IsDir(dir)) SK_RETURN_IF_ERROR(io::MakeDirs(dir));
    if (::access(dir.c_str(), W_OK) != 0)
      return Status::FromErrno(errno, "output directory is not writable", Location{.file = dir});
    w->RemoveStaleTemps(0);
    if (resuming) {
      SK_RETURN_IF_ERROR(w->LoadJournal());
      w->RemoveStaleTemps(w->summary_.shards.size());
    } else {
      // The journal exists from the start, so that a write killed before its
      // first shard is committed can be resumed (from nothing) too.
      SK_RETURN_IF_ERROR(w->WriteJournal());
    }
    return std::unique_ptr<SampleWriter>(std::move(w));
  }

  Status Write(const Sample& in) override {
    if (finished_) return Status::Internal("Write() after Finish()");
    if (!error_.ok()) return error_;
    std::string key = in.key;
    Location where{.key = in.key, .index = int64_t(total_samples_)};
    SK_RETURN_IF_ERROR(paths::CheckSafeKey(key).At(where));
    size_t base = key.rfind('/');
    base = base == std::string::npos ? 0 : base + 1;
    if (key.find('.', base) != std::string::npos) {
      if (opts_.key_dots != KeyDots::kReplace)
        return Status::Invalid(fmt::format("key '{}' has a dot in its last path component, which a WebDataset "
                                           "reader would take as the start of the extension; pass "
                                           "--key-dots=replace to write such keys with '_' in place of '.'",
                                           in.key),
                               where);
      for (size_t i = base; i < key.size(); ++i)
        if (key[i] == '.') key[i] = '_';
    }
    if (in.fields.empty())
      return Status::Invalid("sample has no fields: it cannot be stored in a tar shard", where);
    std::vector<const Field*> fields;
    for (const auto& f : in.fields) {
      if (f.ext.empty() || f.ext.front() == '.' || f.ext.find('/') != std::string::npos ||
          f.ext.find('\0') != std::string::npos || paths::Lower(f.ext) != f.ext)
        return Status::Invalid(fmt::format("bad field extension '{}' (expected lowercase, no '/', no leading dot)",
                                           f.ext),
                               where);
      fields.push_back(&f);
    }
    std::sort(fields.begin(), fields.end(), [](const Field* a, const Field* b) { return a->ext < b->ext; });
    for (size_t i = 1; i < fields.size(); ++i)
      if (fields[i]->ext == fields[i - 1]->ext)
        return Status::Invalid(fmt::format("field '{}' appears twice", fields[i]->ext), where);
    if (shard_samples_ > 0 && key == prev_key_)
      return Status::Invalid("same key as the previous sample: the two would merge into one on read", where);
    const uint64_t sample_sum = in.checksum();
    if (total_samples_ < resume_samples_) return Skip(key, sample_sum, where);

    // Upper bound of the bytes this sample adds (headers, pax records, padding).
    uint64_t need = 0;
    for (const Field* f : fields) {
      size_t name_len = key.size() + 1 + f->ext.size();
      need += tar::kBlock + (f->data.size() + tar::kBlock - 1) / tar::kBlock * tar::kBlock;
      need += tar::kBlock + (2 * name_len + 64 + tar::kBlock - 1) / tar::kBlock * tar::kBlock;  // pax header
    }
    const uint64_t max_samples =
        !opts_.wds.shard_plan.empty()
            ? opts_.wds.shard_plan[std::min(summary_.shards.size(), opts_.wds.shard_plan.size() - 1)]
            : (opts_.samples_per_shard ? opts_.samples_per_shard : UINT64_MAX);
    if (ar_ && (shard_samples_ >= max_samples ||
                (opts_.wds.shard_plan.empty() && ShardBytes() + need + 2 * tar::kBlock > opts_.shard_size))) {
      SK_RETURN_IF_ERROR(Keep(FinishShard()));
    }
    if (!ar_) SK_RETURN_IF_ERROR(Keep(StartShard()));

    Utf8Locale utf8;
    for (const Field* f : fields) {
      std::string name = key + "." + f->ext;
      struct archive_entry* e = archive_entry_new();
      archive_entry_copy_pathname(e, name.c_str());
      archive_entry_set_filetype(e, AE_IFREG);
      archive_entry_set_perm(e, 0444);
      archive_entry_set_size(e, int64_t(f->data.size()));
      archive_entry_set_mtime(e, 0, 0);
      archive_entry_set_uid(e, 0);
      archive_entry_set_gid(e, 0);
      int r = archive_write_header(ar_, e);
      archive_entry_free(e);
      if (r < ARCHIVE_WARN) return Keep(ArchiveError("cannot write tar header", name));
      uint64_t off = ShardBytes();
      const uint8_t* p = f->data.data();
      size_t left = f->data.size();
      while (left > 0) {
        la_ssize_t n = archive_write_data(ar_, p, left);
        if (n <= 0) return Keep(ArchiveError("cannot write member data", name));
        p += n;
        left -= size_t(n);
      }
      if (archive_write_finish_entry(ar_) < ARCHIVE_WARN) return Keep(ArchiveError("cannot finish member", name));
      if (HasSpace(name)) idx_names_ok_ = false;
      idx_.push_back(IdxEntry{f->ext, std::move(name), off, f->data.size()});
      fields_.insert(f->ext);
    }
    idx_lines_.push_back(idx_.size());
    paths::AddSampleToDigest(digest_, key, sample_sum);
    sums_.push_back(sample_sum);
    prev_key_ = key;
    ++shard_samples_;
    ++total_samples_;
    return Status::OK();
  }

  Result<WriteSummary> Finish() override {
    if (finished_) return Status::Internal("Finish() called twice");
    if (!error_.ok()) return error_;
    if (total_samples_ < resume_samples_)
      return Status::Invalid(fmt::format("the source ended after {} samples, but the interrupted write this one "
                                         "resumes had committed {}: resume needs the same source, in the same "
                                         "order, with the same options",
                                         total_samples_, resume_samples_),
                             Location{.file = journal_});
    if (ar_) SK_RETURN_IF_ERROR(Keep(FinishShard()));
    json j;
    j["format"] = "wds";
    j["version"] = 1;
    j["pattern"] = BaseOf(pattern_);
    j["num_samples"] = total_samples_;
    j["class_names"] = opts_.class_names;
    j["fields"] = std::vector<std::string>(fields_.begin(), fields_.end());
    uint64_t total = 0;
    json shards = json::array();
    for (const auto& s : summary_.shards) {
      json o;
      o["path"] = BaseOf(s.path);
      o["samples"] = s.samples;
      o["bytes"] = s.bytes;
      o["checksum"] = s.checksum;
      if (opts_.wds.write_index) o["index"] = BaseOf(IdxPathFor(s.path));
      o["sample_checksums"] = BaseOf(wds::SumsPath(s.path));
      shards.push_back(std::move(o));
      total += s.bytes;
    }
    j["total_bytes"] = total;
    j["shards"] = std::move(shards);
    SK_RETURN_IF_ERROR(Keep(io::WriteFileAtomic(manifest_, j.dump(2) + "\n", true)));
    // Complete: the journal goes (a crash before this leaves a journal that lists
    // every shard, and a resume then only rewrites the manifest).
    if (::unlink(journal_.c_str()) == 0) (void)io::FsyncDir(io::DirName(journal_));
    summary_.samples = total_samples_;
    summary_.bytes = total;
    finished_ = true;
    return summary_;
  }

 private:
  // Makes a failure sticky and removes the unfinished shard's temporary file at
  // once. The committed shards and the journal stay: the resumable state, and the
  // message says how to continue.
  Status Keep(Status s) {
    if (!s.ok()) {
      if (error_.ok()) {
        keep_state_ = true;
        s = Status(s.code(),
                   fmt::format("{}; the {} complete shard(s) ({} samples) and the journal '{}' are kept: run the "
                               "same conversion again with --resume to continue from shard {}",
                               s.message(), summary_.shards.size(), committed_samples_, journal_,
                               summary_.shards.size()),
                   s.where());
        error_ = s;
      }
      AbortShard();
    }
    return s;
  }

  // A sample the resumed write had committed: checked against the journal's
  // digest of its shard, then dropped.
  Status Skip(const std::string& key, uint64_t sample_sum, const Location& where) {
    paths::AddSampleToDigest(digest_, key, sample_sum);
    ++total_samples_;
    ++skip_in_shard_;
    const Resumed& r = resumed_[skip_shard_];
    if (skip_in_shard_ < r.samples) return Status::OK();
    uint64_t got = XXH3_64bits_digest(digest_);
    XXH3_64bits_reset(digest_);
    if (got != r.digest) {
      error_ = Status::Invalid(
          fmt::format("resume: samples {}..{} differ from the ones the interrupted write put in shard {} (keys or "
                      "bytes changed): resume needs the same source, in the same order, with the same options; "
                      "start over with --overwrite",
                      total_samples_ - r.samples, total_samples_ - 1, skip_shard_),
          Location{.file = summary_.shards[skip_shard_].path, .shard = int64_t(skip_shard_), .key = where.key});
      return error_;
    }
    ++skip_shard_;
    skip_in_shard_ = 0;
    return Status::OK();
  }

  json OptionsJson() const {
    json o;
    o["shard_size"] = opts_.shard_size;
    o["samples_per_shard"] = opts_.samples_per_shard;
    o["class_names"] = opts_.class_names;
    o["key_dots"] = opts_.key_dots == KeyDots::kReplace ? "replace" : "error";
    o["write_index"] = opts_.wds.write_index;
    o["shard_plan"] = opts_.wds.shard_plan;
    return o;
  }

  // "<manifest>.partial": what is committed so far, rewritten atomically after
  // every shard. Per shard: file, samples, bytes, file checksum, and a digest of
  // its samples (XXH3 over each sample's checksum and key) that a resume checks
  // the source against.
  Status WriteJournal() {
    json j;
    j["format"] = "wds-partial";
    j["version"] = 1;
    j["pattern"] = BaseOf(pattern_);
    j["options"] = OptionsJson();
    j["fields"] = std::vector<std::string>(fields_.begin(), fields_.end());
    json shards = json::array();
    for (size_t i = 0; i < summary_.shards.size(); ++i) {
      const auto& s = summary_.shards[i];
      json o;
      o["path"] = BaseOf(s.path);
      o["samples"] = s.samples;
      o["bytes"] = s.bytes;
      o["checksum"] = s.checksum;
      o["digest"] = paths::ChecksumString(resumed_[i].digest);
      shards.push_back(std::move(o));
    }
    j["shards"] = std::move(shards);
    owns_journal_ = true;
    return io::WriteFileAtomic(journal_, j.dump(1) + "\n", true);
  }

  Status LoadJournal() {
    Location where{.file = journal_};
    SK_ASSIGN_OR_RETURN(std::string text, io::ReadFile(journal_));
    auto bad = [&](const std::string& why) {
      return Status::Corrupt(fmt::format("cannot resume: {}", why), where);
    };
    try {
      json j = json::parse(text);
      if (j.value("format", "") != "wds-partial" || j.value("version", 0) != 1)
        return bad("not a shardkit wds journal");
      if (j.value("pattern", "") != BaseOf(pattern_))
        return bad(fmt::format("it was written for the pattern '{}', not '{}'", j.value("pattern", ""),
                               BaseOf(pattern_)));
      json want = OptionsJson();
      for (auto& [k, v] : want.items())
        if (!j["options"].contains(k) || j["options"][k] != v)
          return Status::Invalid(fmt::format("cannot resume: the interrupted write used {} = {}, this one {} = {}; "
                                             "resume with the same options, or start over with --overwrite",
                                             k, j["options"].value(k, json()).dump(), k, v.dump()),
                                 where);
      for (const auto& f : j.at("fields")) fields_.insert(f.get<std::string>());
      const json& shards = j.at("shards");
      for (size_t i = 0; i < shards.size(); ++i) {
        const json& o = shards[i];
        std::string path = paths::FormatShardPattern(pattern_, i);
        if (o.at("path").get<std::string>() != BaseOf(path)) return bad(fmt::format("shard {} is misnamed", i));
        ShardInfo si{path, o.at("samples").get<uint64_t>(), o.at("bytes").get<uint64_t>(),
                     o.at("checksum").get<std::string>()};
        Location at{.file = path, .shard = int64_t(i)};
        struct stat st;
        if (::stat(path.c_str(), &st) != 0)
          return Status::Corrupt("cannot resume: a shard the journal lists as complete is missing; start over "
                                 "with --overwrite",
                                 at);
        if (uint64_t(st.st_size) != si.bytes)
          return Status::Corrupt(fmt::format("cannot resume: shard has {} bytes, the journal says {}; start over "
                                             "with --overwrite",
                                             st.st_size, si.bytes),
                                 at);
        SK_ASSIGN_OR_RETURN(uint64_t h, paths::HashFile(path));
        if (paths::ChecksumString(h) != si.checksum)
          return Status::Corrupt(fmt::format("cannot resume: shard checksum {} differs from the journal's {}; "
                                             "start over with --overwrite",
                                             paths::ChecksumString(h), si.checksum),
                                 at);
        if (opts_.wds.write_index && !io::Exists(IdxPathFor(path)))
          return Status::Corrupt("cannot resume: the shard's index is missing; start over with --overwrite",
                                 Location{.file = IdxPathFor(path), .shard = int64_t(i)});
        if (!io::Exists(wds::SumsPath(path)))
          return Status::Corrupt("cannot resume: the shard's checksum file is missing; start over with --overwrite",
                                 Location{.file = wds::SumsPath(path), .shard = int64_t(i)});
        std::string digest = o.at("digest").get<std::string>();
        uint64_t d = 0;
        if (digest.size() != 21 || digest.substr(0, 5) != "xxh3:") return bad("bad digest");
        d = std::stoull(digest.substr(5), nullptr, 16);
        resumed_.push_back(Resumed{si.samples, d});
        committed_.push_back(path);
        if (opts_.wds.write_index) committed_.push_back(IdxPathFor(path));
        committed_.push_back(wds::SumsPath(path));
        committed_samples_ += si.samples;
        summary_.shards.push_back(std::move(si));
      }
    } catch (const std::exception& e) {
      return bad(fmt::format("bad journal: {}", e.what()));
    }
    resume_samples_ = committed_samples_;
    // Shards of zero samples cannot exist; still, never divide the skip by them.
    for (const auto& r : resumed_)
      if (r.samples == 0) return bad("a shard with no samples");
    return Status::OK();
  }

  // Temporary files a killed writer left for shard `from` and what follows it.
  void RemoveStaleTemps(size_t from) {
    std::string dir = io::DirName(paths::FormatShardPattern(pattern_, from));
    std::vector<std::string> bases = {BaseOf(paths::FormatShardPattern(pattern_, from)), BaseOf(journal_),
                                      BaseOf(manifest_)};
    if (opts_.wds.write_index) bases.push_back(BaseOf(IdxPathFor(paths::FormatShardPattern(pattern_, from))));
    bases.push_back(BaseOf(wds::SumsPath(paths::FormatShardPattern(pattern_, from))));
    std::error_code ec;
    for (auto it = std::filesystem::directory_iterator(dir, ec); !ec && it != std::filesystem::directory_iterator();
         it.increment(ec)) {
      std::string name = it->path().filename().string();
      for (const auto& b : bases)
        if (name.rfind("." + b + ".tmp-", 0) == 0) ::unlink(it->path().c_str());
    }
  }

  uint64_t ShardBytes() const { return ar_ ? uint64_t(archive_filter_bytes(ar_, 0)) : 0; }

  Status ArchiveError(const char* what, const std::string& name) {
    if (!io_error_.ok()) return io_error_;
    return Status::IOError(fmt::format("{} for '{}': {}", what, name, archive_error_string(ar_)),
                           Location{.file = file_ ? file_->path() : "", .shard = int64_t(summary_.shards.size())});
  }

  static la_ssize_t WriteCb(struct archive*, void* self, const void* buf, size_t n) {
    auto* w = static_cast<WdsWriter*>(self);
    if (w->discard_) return la_ssize_t(n);
    Status s = w->file_->Write(buf, n);
    if (!s.ok()) {
      w->io_error_ = s;
      return -1;
    }
    XXH3_64bits_update(w->hash_, buf, n);
    return la_ssize_t(n);
  }

  Status StartShard() {
    std::string path = paths::FormatShardPattern(pattern_, summary_.shards.size());
    // Resuming: a shard past the journal may exist (committed just before a
    // crash, before the journal was rewritten); it is written again, identically.
    SK_ASSIGN_OR_RETURN(file_, io::AtomicFile::Create(path, opts_.overwrite || opts_.resume));
    if (!hash_) hash_ = XXH3_createState();
    XXH3_64bits_reset(hash_);
    Utf8Locale utf8;
    ar_ = archive_write_new();
    discard_ = false;
    io_error_ = Status::OK();
    if (archive_write_set_format_pax_restricted(ar_) != ARCHIVE_OK ||
        archive_write_set_bytes_per_block(ar_, 0) != ARCHIVE_OK ||
        archive_write_open2(ar_, this, nullptr, &WdsWriter::WriteCb, nullptr, nullptr) != ARCHIVE_OK) {
      Status s = Status::Internal(fmt::format("libarchive setup failed: {}", archive_error_string(ar_)),
                                  Location{.file = path});
      AbortShard();
      return s;
    }
    shard_samples_ = 0;
    idx_.clear();
    idx_lines_.clear();
    idx_names_ok_ = true;
    sums_.clear();
    return Status::OK();
  }

  void AbortShard() {
    if (ar_) {
      discard_ = true;
      archive_write_free(ar_);
      ar_ = nullptr;
    }
    file_.reset();  // unlinks the temporary file
  }

  Status FinishShard() {
    {
      Utf8Locale utf8;
      int r = archive_write_close(ar_);
      if (r != ARCHIVE_OK) return ArchiveError("cannot finish shard", "end of archive");
      archive_write_free(ar_);
      ar_ = nullptr;
    }
    std::string path = file_->path();
    uint64_t size = file_->size();
    SK_RETURN_IF_ERROR(file_->Commit());
    file_.reset();
    committed_.push_back(path);
    if (opts_.wds.write_index) {
      // DALI's v1.2 index; v1.1 (no names) when a name holds white space,
      // which would break its space-separated lines.
      std::string text = wds::DaliIndexText(idx_, idx_lines_);
      std::string idx_path = IdxPathFor(path);
      SK_RETURN_IF_ERROR(io::WriteFileAtomic(idx_path, text, true));
      committed_.push_back(idx_path);
    }
    // Per-sample checksums, for verify (formats/wds_index.h has the layout).
    std::string sums_path = wds::SumsPath(path);
    SK_RETURN_IF_ERROR(io::WriteFileAtomic(sums_path, wds::SumsText(sums_), true));
    committed_.push_back(sums_path);
    summary_.shards.push_back(
        ShardInfo{path, shard_samples_, size, paths::ChecksumString(XXH3_64bits_digest(hash_))});
    resumed_.push_back(Resumed{shard_samples_, XXH3_64bits_digest(digest_)});
    XXH3_64bits_reset(digest_);
    committed_samples_ += shard_samples_;
    shard_samples_ = 0;
    return WriteJournal();
  }

  std::string pattern_;
  WriteOptions opts_;
  std::string manifest_;
  struct archive* ar_ = nullptr;
  std::unique_ptr<io::AtomicFile> file_;
  XXH3_state_t* hash_ = nullptr;
  bool discard_ = false;
  Status io_error_;  // the file layer's error behind a libarchive failure
  Status error_;     // sticky: the first failure ends the writer
  uint64_t shard_samples_ = 0, total_samples_ = 0;
  std::string prev_key_;
  std::vector<IdxEntry> idx_;       // members of the current shard
  std::vector<size_t> idx_lines_;   // end of each sample in idx_
  bool idx_names_ok_ = true;
  std::vector<uint64_t> sums_;      // per-sample checksums of the current shard
  std::set<std::string> fields_;
  WriteSummary summary_;
  std::vector<std::string> committed_;  // files under their final names, removed if never finished
  bool finished_ = false;
  // Resumable writes.
  struct Resumed {
    uint64_t samples = 0;
    uint64_t digest = 0;  // of the shard's samples (paths::AddSampleToDigest)
  };
  std::string journal_;
  bool keep_state_ = false;             // leave committed shards + journal when destroyed unfinished
  bool owns_journal_ = false;           // this writer wrote the journal (a refused Create leaves it)
  XXH3_state_t* digest_ = nullptr;      // of the current shard's samples
  std::vector<Resumed> resumed_;        // per committed shard
  uint64_t committed_samples_ = 0;
  uint64_t resume_samples_ = 0;         // samples to check and drop before writing
  size_t skip_shard_ = 0;
  uint64_t skip_in_shard_ = 0;
};

}  // namespace

Format WdsFormat() {
  return Format{
      .name = "wds",
      .description = "WebDataset tar shards (read: x.tar, x-{000..009}.tar, a.tar::b.tar, x.manifest.json, 'pipe:CMD' "
                     "(streamed, in order only); "
                     "write: out/x-%06d.tar)",
      .bid_read = wds::BidRead,
      .bid_write = [](const std::string& path) -> int {
        return EndsWith(paths::Lower(path), ".tar") && paths::CheckShardPattern(path).ok() ? 90 : 0;
      },
      .open = OpenWds,
      .create = WdsWriter::Make,
      .extensions = {"tar", "tgz", "gz", "json", "idx"},
      .prefixes = {"pipe"},
      .writes_shards = true,
      .list_shards = wds::ListShards,
      .locate_samples = wds::LocateSamples,
  };
}

// ---------------------------------------------------------------------------
// Shared with `shardkit index` and verify (formats/wds_index.h).

namespace wds {

std::string DaliIndexPath(const std::string& tar_path) { return IdxPathFor(tar_path); }

std::string DaliIndexText(const std::vector<IndexMember>& members, const std::vector<size_t>& sample_ends) {
  bool names_ok = std::none_of(members.begin(), members.end(), [](const IndexMember& m) { return HasSpace(m.name); });
  std::string text = fmt::format("{} {}\n", names_ok ? "v1.2" : "v1.1", sample_ends.size());
  size_t start = 0;
  for (size_t end : sample_ends) {
    for (size_t i = start; i < end; ++i) {
      const auto& e = members[i];
      if (i > start) text += ' ';
      text += fmt::format("{} {} {}", e.ext, e.offset, e.size);
      if (names_ok) text += " " + e.name;
    }
    text += '\n';
    start = end;
  }
  return text;
}

Result<ShardMembers> ScanShardMembers(const std::string& tar_path, int64_t shard) {
  SK_ASSIGN_OR_RETURN(auto map, MapShard(tar_path, shard));
  ShardMembers out;
  out.file_size = map->size();
  tar::Scanner scan(map->data(), map->size(), tar_path);
  tar::Member m;
  size_t sample_start = 0;
  for (;;) {
    auto r = scan.Next(&m);
    if (!r.ok()) {
      Status s = std::move(r).take_status();
      s.At(Location{.shard = shard});
      return s;
    }
    if (!*r) break;
    std::string key, ext;
    SK_ASSIGN_OR_RETURN(NameKind kind, Classify(m, tar_path, shard, &key, &ext));
    if (kind == NameKind::kSkip) continue;
    if (out.keys.empty() || key != out.keys.back()) {
      if (!out.keys.empty()) out.sample_ends.push_back(out.members.size());
      sample_start = out.members.size();
      out.keys.push_back(key);
    } else {
      for (size_t i = sample_start; i < out.members.size(); ++i)
        if (out.members[i].ext == ext)
          return Status::Corrupt(fmt::format("field '{}' appears twice in sample '{}'", ext, key),
                                 Location{.file = tar_path, .shard = shard, .offset = int64_t(m.header_offset),
                                          .key = key});
    }
    out.members.push_back(IndexMember{std::move(ext), m.name, m.data_offset, m.size});
  }
  if (!out.keys.empty()) out.sample_ends.push_back(out.members.size());
  return out;
}

std::string SumsPath(const std::string& tar_path) { return tar_path + ".xxh3"; }

std::string SumsText(const std::vector<uint64_t>& sums) {
  std::string text = fmt::format("shardkit-sample-xxh3 v1 {}\n", sums.size());
  text.reserve(text.size() + sums.size() * 17);
  for (uint64_t v : sums) text += fmt::format("{:016x}\n", v);
  return text;
}

Result<std::vector<uint64_t>> ReadSums(const std::string& sums_path) {
  if (!io::Exists(sums_path)) return Status::NotFound("no per-sample checksum file", Location{.file = sums_path});
  SK_ASSIGN_OR_RETURN(std::string text, io::ReadFile(sums_path));
  auto bad = [&](std::string why, size_t line) {
    return Status::Corrupt(fmt::format("per-sample checksum file, line {}: {}", line, why),
                           Location{.file = sums_path});
  };
  size_t nl = text.find('\n');
  if (nl == std::string::npos || text.compare(0, 24, "shardkit-sample-xxh3 v1 ") != 0)
    return bad("expected 'shardkit-sample-xxh3 v1 <count>'", 1);
  uint64_t n = 0;
  auto [p, ec] = std::from_chars(text.data() + 24, text.data() + nl, n);
  if (ec != std::errc() || p != text.data() + nl) return bad("bad count", 1);
  if (n > (text.size() - nl) / 17) return bad(fmt::format("declares {} checksums in {} bytes", n, text.size()), 1);
  std::vector<uint64_t> out;
  out.reserve(n);
  size_t pos = nl + 1;
  for (uint64_t i = 0; i < n; ++i) {
    if (pos + 17 > text.size() || text[pos + 16] != '\n') return bad("expected 16 hex digits", i + 2);
    uint64_t v = 0;
    auto [q, e2] = std::from_chars(text.data() + pos, text.data() + pos + 16, v, 16);
    if (e2 != std::errc() || q != text.data() + pos + 16) return bad("expected 16 hex digits", i + 2);
    out.push_back(v);
    pos += 17;
  }
  if (pos != text.size()) return bad("data after the last checksum", n + 2);
  return out;
}

}  // namespace wds

}  // namespace shardkit::formats
