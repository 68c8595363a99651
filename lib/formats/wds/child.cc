// The child process behind a `pipe:` shard (child.h).
#include "formats/wds/child.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

namespace shardkit::formats::wds {

Status ChildStream::Start() {
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

Status ChildStream::Finish(uint64_t bytes) {
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
                                        command(), WEXITSTATUS(st), bytes),
                            Where());
  } else if (WIFSIGNALED(st)) {
    exit_ = Status::IOError(fmt::format("command '{}' was killed by signal {} ({}) after {} bytes of output",
                                        command(), WTERMSIG(st), strsignal(WTERMSIG(st)), bytes),
                            Where());
  }
  return exit_;
}

void ChildStream::Close() {
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

}  // namespace shardkit::formats::wds
