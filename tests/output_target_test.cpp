// Where write_file_atomically writes (the rule is in qkv/output_file.h): the
// library-level matrix behind every output option. tests/python/test_output_targets.py runs the
// same cases through each option of the `qkv` command.
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <thread>

#include "io_test_util.h"
#include "qkv/io.h"
#include "qkv/output_file.h"
#include "test_util.h"

namespace qkv {
namespace {

using test::expect_error;
using test::read_raw;
using test::TempDir;
using test::write_raw;

TEST(OutputTarget, SymlinkToAFileIsWrittenThroughAtomically) {
  TempDir dir;
  ASSERT_EQ(::mkdir(dir.file("sub").c_str(), 0755), 0);
  write_raw(dir.file("sub/real.bin"), "stale");
  ASSERT_EQ(::symlink("sub/real.bin", dir.file("link.bin").c_str()), 0);  // relative to the link's directory
  write_file_atomically(dir.file("link.bin"), "fresh");
  struct stat st {};
  ASSERT_EQ(::lstat(dir.file("link.bin").c_str(), &st), 0);
  EXPECT_TRUE(S_ISLNK(st.st_mode)) << "the link was replaced by a file";
  EXPECT_EQ(read_raw(dir.file("sub/real.bin")), "fresh");
  EXPECT_EQ(dir.entries(), (std::vector<std::string>{"link.bin", "sub"}));
  EXPECT_TRUE(std::filesystem::is_empty(dir.file("sub")) == false);
  const OutputTarget t = resolve_output(dir.file("link.bin"));
  EXPECT_EQ(t.kind, OutputKind::file);
  EXPECT_EQ(t.resolved, dir.file("sub/real.bin"));
}

TEST(OutputTarget, DanglingSymlinkCreatesItsTargetOrIsRefused) {
  TempDir dir;
  ASSERT_EQ(::symlink(dir.file("made.bin").c_str(), dir.file("a").c_str()), 0);
  write_file_atomically(dir.file("a"), "x");
  EXPECT_EQ(read_raw(dir.file("made.bin")), "x");
  ASSERT_EQ(::symlink(dir.file("missing/x.bin").c_str(), dir.file("b").c_str()), 0);
  expect_error([&] { write_file_atomically(dir.file("b"), "x"); }, {dir.file("b"), "missing does not exist"});
  ASSERT_EQ(::symlink("loop", dir.file("loop").c_str()), 0);
  expect_error([&] { write_file_atomically(dir.file("loop"), "x"); },
               {dir.file("loop"), "more than 40 symbolic links"});
  EXPECT_EQ(dir.entries(), (std::vector<std::string>{"a", "b", "loop", "made.bin"}));
}

TEST(OutputTarget, SocketAndDirectoryAreRefusedUntouched) {
  TempDir dir;
  const std::string sock = dir.file("s");
  const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  ASSERT_LT(sock.size(), sizeof addr.sun_path);
  std::memcpy(addr.sun_path, sock.c_str(), sock.size() + 1);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  expect_error([&] { write_file_atomically(sock, "x"); }, {sock, "is a socket"});
  ::close(fd);
  struct stat st {};
  ASSERT_EQ(::lstat(sock.c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  ASSERT_EQ(::symlink(dir.path().c_str(), dir.file("to-dir").c_str()), 0);
  expect_error([&] { write_file_atomically(dir.file("to-dir"), "x"); }, {"is a directory"});
  EXPECT_EQ(dir.entries(), (std::vector<std::string>{"s", "to-dir"}));
}

// A copy of /dev/null and /dev/full (mknod needs root): written, never replaced.
TEST(OutputTarget, CharacterDevicesAreWrittenInPlace) {
  if (::geteuid() != 0) GTEST_SKIP() << "mknod of a character device needs root";
  TempDir dir;
  const std::string null = dir.file("null"), full = dir.file("full");
  ASSERT_EQ(::mknod(null.c_str(), S_IFCHR | 0666, makedev(1, 3)), 0);
  ASSERT_EQ(::mknod(full.c_str(), S_IFCHR | 0666, makedev(1, 7)), 0);
  write_file_atomically(null, std::string(100000, 'x'));
  expect_error([&] { write_file_atomically(full, "x"); }, {full, "No space left on device"});
  for (const std::string& dev : {null, full}) {
    struct stat st {};
    ASSERT_EQ(::lstat(dev.c_str(), &st), 0);
    EXPECT_TRUE(S_ISCHR(st.st_mode)) << dev << " was replaced";
  }
  EXPECT_EQ(dir.entries(), (std::vector<std::string>{"full", "null"}));
}

TEST(OutputTarget, FifoStreamsToItsReader) {
  TempDir dir;
  const std::string fifo = dir.file("pipe");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const std::string payload(300000, 'q');  // more than a pipe buffer: the writer must wait for the reader
  std::string got;
  std::thread reader([&] { got = read_raw(fifo); });
  write_file_atomically(fifo, payload);
  reader.join();
  EXPECT_EQ(got, payload);
  struct stat st {};
  ASSERT_EQ(::lstat(fifo.c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode));
}

TEST(OutputTarget, DevFdNamesWriteToTheOpenDescriptor) {
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  const std::string name = "/dev/fd/" + std::to_string(fds[1]);
  const OutputTarget t = resolve_output(name);
  EXPECT_EQ(t.kind, OutputKind::descriptor);
  EXPECT_EQ(t.fd, fds[1]);
  write_file_atomically(name, "through the pipe");
  ::close(fds[1]);
  char buf[64] = {};
  EXPECT_EQ(::read(fds[0], buf, sizeof buf), 16);
  EXPECT_STREQ(buf, "through the pipe");
  expect_error([&] { resolve_output("/dev/fd/" + std::to_string(fds[0])); }, {"not open for writing"});
  ::close(fds[0]);
  EXPECT_EQ(resolve_output("/dev/stdout").kind, OutputKind::descriptor);
}

}  // namespace
}  // namespace qkv
