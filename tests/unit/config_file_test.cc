// Hostile GW_CONFIG_FILE contents and files (issue 33, items 10 and 12): only a regular file of at
// most ConfigFile::kMaxBytes is read, a FIFO is refused without waiting for a writer, tables
// nested deeper than ConfigFile::kMaxDepth never reach toml++, and errors quote long values by an
// excerpt and secrets not at all.
#include "core/config_file.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <memory>
#include <string>
#include <thread>

#include "core/config.h"
#include "core/config_snapshot.h"
#include "core/core_config.h"

namespace gw::config {
namespace {

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/gw-config-file-XXXXXX";
    if (::mkdtemp(tmpl) != nullptr) path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  std::string file(const std::string& name, const std::string& text) const {
    const std::string p = path_ + "/" + name;
    std::ofstream(p, std::ios::binary) << text;
    return p;
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// The one error of a file that loads nothing.
std::string only_error(const ConfigFile& f) {
  EXPECT_TRUE(f.entries().empty()) << f.path();
  EXPECT_EQ(f.errors().size(), 1u) << f.path();
  return f.errors().empty() ? std::string() : f.errors()[0];
}

TEST(ConfigFileTest, ADirectoryIsRefusedNotReadAsEmpty) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  auto f = ConfigFile::load(dir.path());
  EXPECT_NE(only_error(*f).find("is a directory, not a settings file"), std::string::npos)
      << only_error(*f);
}

TEST(ConfigFileTest, ACharacterDeviceIsRefusedUnread) {
  auto f = ConfigFile::load("/dev/zero");  // used to read 4 GiB, then abort on bad_alloc
  EXPECT_NE(only_error(*f).find("/dev/zero: is a character device"), std::string::npos)
      << only_error(*f);
}

// Opening a FIFO for reading used to wait for a writer forever; it is refused at once. The load
// runs on a thread of its own so that the test ends (failing) even where it would block.
TEST(ConfigFileTest, AFifoIsRefusedWithoutWaitingForAWriter) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  const std::string fifo = dir.path() + "/fifo.toml";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  auto result = std::make_shared<std::promise<std::string>>();
  std::future<std::string> done = result->get_future();
  std::thread([fifo, result] { result->set_value(only_error(*ConfigFile::load(fifo))); }).detach();
  if (done.wait_for(std::chrono::seconds(5)) != std::future_status::ready) {
    // Release the reader (a writer that leaves at once: end of file) before failing.
    const int w = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);
    if (w >= 0) ::close(w);
    done.wait_for(std::chrono::seconds(5));
    FAIL() << "loading a FIFO blocked for 5 s";
  }
  const std::string why = done.get();
  EXPECT_NE(why.find("is a FIFO, not a settings file"), std::string::npos) << why;
}

TEST(ConfigFileTest, AFileOverTheSizeCapIsRefused) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  // The largest allowed file loads (a comment of kMaxBytes)...
  std::string text = "timeout_ms = 1\n#";
  text.resize(ConfigFile::kMaxBytes, 'x');
  auto ok = ConfigFile::load(dir.file("max.toml", text));
  EXPECT_TRUE(ok->errors().empty()) << ok->errors()[0];
  EXPECT_NE(ok->find("timeout_ms"), nullptr);
  // ...one byte more does not, read from a file or parsed from memory (the fuzz target's way).
  text += 'x';
  auto big = ConfigFile::load(dir.file("big.toml", text));
  EXPECT_NE(only_error(*big).find("more than a settings file may hold"), std::string::npos)
      << only_error(*big);
  auto parsed = ConfigFile::parse(text, "mem.toml");
  EXPECT_NE(only_error(*parsed).find("more than a settings file may hold"), std::string::npos);
  // A sparse file of 8 GiB is refused by its size, unread.
  const std::string sparse = dir.file("sparse.toml", "");
  ASSERT_EQ(::truncate(sparse.c_str(), 8ll << 30), 0);
  auto huge = ConfigFile::load(sparse);
  EXPECT_NE(only_error(*huge).find("8589934592 bytes"), std::string::npos) << only_error(*huge);
}

std::string repeated(const std::string& part, int n, const std::string& sep) {
  std::string out;
  for (int i = 0; i < n; ++i) out += (i ? sep : "") + part;
  return out;
}

// 100,000 levels used to overflow the stack (the recursive flatten, and toml++'s recursive
// destruction) after building tables in memory quadratic in the depth.
TEST(ConfigFileTest, TablesNestedTooDeeplyAreRefusedBeforeTomlppSeesThem) {
  const int deep = 100000;
  for (const std::string& text :
       {"[" + repeated("a", deep, ".") + "]\nx = 1\n", repeated("a", deep, ".") + " = 1\n",
        "[[" + repeated("a", deep, ".") + "]]\n",
        "[a.b.c.d]\n" + repeated("e", ConfigFile::kMaxDepth - 3, ".") + " = 1\n",
        "x = " + repeated("{ a = ", ConfigFile::kMaxDepth, "") + "1" +
            repeated("}", ConfigFile::kMaxDepth, "") + "\n",
        "x = [ { " + repeated("b", ConfigFile::kMaxDepth, ".") + " = 1 } ]\n"}) {
    auto f = ConfigFile::parse(text, "deep.toml");
    const std::string why = only_error(*f);
    EXPECT_NE(why.find("tables nested more than 16 levels deep"), std::string::npos)
        << why << "\nfor " << text.substr(0, 80);
  }
  // Keys of kMaxDepth parts are fine (unknown keys for the registry to report), and dots elsewhere
  // (quoted keys, floats, strings, times) are not levels.
  for (const std::string& text :
       {"[" + repeated("a", ConfigFile::kMaxDepth - 1, ".") + "]\nx = 1\n",
        "[a.b]\n" + repeated("c", ConfigFile::kMaxDepth - 2, ".") + " = 1\n",
        "x = " + repeated("{ a = ", ConfigFile::kMaxDepth - 1, "") + "1" +
            repeated("}", ConfigFile::kMaxDepth - 1, "") + "\n",
        "\"" + repeated("q", 100, ".") + "\" = 1\n" + "f = 1.5\ns = \"" + repeated("s", 100, ".") +
            "\"\nt = 07:32:00.999\n" + "l = [" + repeated("1.5", 100, ", ") + "]\n"}) {
    auto f = ConfigFile::parse(text, "ok.toml");
    EXPECT_TRUE(f->errors().empty()) << f->errors()[0] << "\nfor " << text.substr(0, 80);
    EXPECT_FALSE(f->entries().empty());
  }
}

TEST(ConfigFileTest, OneKeySpeltTwiceIsAnError) {
  auto f = ConfigFile::parse("socket_chunk = 1\n[socket]\nchunk = 2\n", "twice.toml");
  EXPECT_NE(only_error(*f).find("twice.toml:3: key 'socket_chunk' is set twice (lines 1 and 3"),
            std::string::npos)
      << only_error(*f);
}

// Sets an environment variable for one test.
class ScopedVar {
 public:
  ScopedVar(const char* name, const std::string& value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    had_ = std::getenv(name) != nullptr;
    ::setenv(name, value.c_str(), 1);
  }
  ~ScopedVar() {
    if (had_) {
      ::setenv(name_, old_.c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::string old_;
  bool had_ = false;
};

// A 10 MB log level used to be echoed whole (twice) in the error.
TEST(ConfigFileTest, ErrorsQuoteLongValuesByAnExcerpt) {
  const std::string huge(10 << 20, 'v');
  {
    ScopedVar level("GW_LOG_LEVEL", huge);
    ScopedVar timeout("GW_TIMEOUT_MS", "1" + huge);
    Status s = validate();
    ASSERT_FALSE(s.ok());
    EXPECT_LT(s.message().size(), 2000u) << s.message().substr(0, 2000);
    EXPECT_NE(s.message().find("GW_LOG_LEVEL=" + std::string(kExcerptBytes, 'v') + "... (" +
                               std::to_string(huge.size()) + " bytes)"),
              std::string::npos)
        << s.message().substr(0, 2000);
    Status api = set(core_config::kTimeoutMs, huge);
    EXPECT_LT(api.message().size(), 1000u);
  }
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  ScopedVar file("GW_CONFIG_FILE",
                 dir.file("long.toml", "log_level = \"" + std::string(100000, 'w') + "\"\n" +
                                           std::string(100000, 'k') + " = 1\n"));
  Status s = validate();
  ASSERT_FALSE(s.ok());
  EXPECT_LT(s.message().size(), 2000u) << s.message().substr(0, 2000);
  EXPECT_NE(s.message().find("(100000 bytes)"), std::string::npos) << s.message();
  EXPECT_EQ(excerpt("short"), "short");
}

TEST(ConfigFileTest, SecretsAreShownOnlyAsSetOrUnset) {
  ASSERT_TRUE(core_config::kJobToken.secret);
  Value v;
  EXPECT_EQ(shown(core_config::kJobToken, v), "(unset)");
  v.text = "hunter2";
  EXPECT_EQ(shown(core_config::kJobToken, v), "(set)");
  EXPECT_EQ(shown(core_config::kHostId, v), "hunter2");
  ScopedVar token("GW_JOB_TOKEN", "hunter2-token");
  for (bool toml : {false, true}) {
    const std::string out = dump(toml);
    EXPECT_EQ(out.find("hunter2"), std::string::npos) << out;
    EXPECT_NE(out.find("(set)"), std::string::npos) << out;
  }
}

}  // namespace
}  // namespace gw::config
