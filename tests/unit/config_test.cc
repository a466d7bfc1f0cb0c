// core/config (the table of tunables), core/status (Status, Result, macros) and core/log, plus a
// check that docs/configuration.md lists every row of the table exactly as the table says.
#include "core/config.h"

#include <gtest/gtest.h>

#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "core/log.h"
#include "core/status.h"

namespace gw {
namespace {

using config::Key;

// Sets variables for one test and restores the previous environment afterwards.
class EnvGuard {
 public:
  ~EnvGuard() {
    for (const auto& [k, v] : saved_) {
      if (v) {
        setenv(k.c_str(), v->c_str(), 1);
      } else {
        unsetenv(k.c_str());
      }
    }
  }
  void set(const char* k, const char* v) {
    remember(k);
    setenv(k, v, 1);
  }
  void unset(const char* k) {
    remember(k);
    unsetenv(k);
  }

 private:
  void remember(const char* k) {
    if (saved_.count(k)) return;
    const char* old = std::getenv(k);
    saved_[k] = old ? std::optional<std::string>(old) : std::nullopt;
  }
  std::map<std::string, std::optional<std::string>> saved_;
};

TEST(ConfigTest, TableIsConsistent) {
  const auto& rows = config::table();
  ASSERT_EQ(rows.size(), static_cast<size_t>(Key::kCount));
  std::set<std::string> names;
  for (size_t i = 0; i < rows.size(); ++i) {
    const auto& r = rows[i];
    EXPECT_EQ(static_cast<size_t>(r.key), i) << r.name;
    EXPECT_EQ(std::string(r.name).rfind("GW_", 0), 0u) << r.name;
    EXPECT_TRUE(names.insert(r.name).second) << "duplicate " << r.name;
    EXPECT_STRNE(r.help, "") << r.name;
    EXPECT_EQ(&config::row(r.key), &r);
    // Every default parses as its own type (otherwise get_* would have nothing to fall back to).
    EnvGuard env;
    env.set(r.name, r.default_value);
    if (r.alias[0] != '\0') env.unset(r.alias);
    EXPECT_TRUE(config::validate().ok()) << r.name << " default '" << r.default_value << "'";
  }
}

TEST(ConfigTest, DefaultsAndOverrides) {
  EnvGuard env;
  env.unset("GW_TIMEOUT_MS");
  EXPECT_EQ(config::get_int(Key::kTimeoutMs), 300000);
  EXPECT_FALSE(config::raw(Key::kTimeoutMs).has_value());
  env.set("GW_TIMEOUT_MS", "1234");
  EXPECT_EQ(config::get_int(Key::kTimeoutMs), 1234);
  EXPECT_EQ(*config::raw(Key::kTimeoutMs), "1234");
  env.unset("GW_SOCKET_CHUNK");
  EXPECT_EQ(config::get_int(Key::kSocketChunk), 256 * 1024);
  env.set("GW_SOCKET_CHUNK", "2M");
  EXPECT_EQ(config::get_int(Key::kSocketChunk), 2 * 1024 * 1024);
  env.set("GW_COST_ALPHA_US", "2.5");
  EXPECT_DOUBLE_EQ(config::get_double(Key::kCostAlphaUs), 2.5);
  env.set("GW_TRANSPORT", "tcp");
  EXPECT_EQ(config::get_string(Key::kTransport), "tcp");
}

TEST(ConfigTest, AliasIsHonouredWhenTheMainNameIsUnset) {
  EnvGuard env;
  env.unset("GW_HOSTID");
  env.unset("NCCL_HOSTID");
  EXPECT_EQ(config::get_string(Key::kHostId), "");
  env.set("NCCL_HOSTID", "from-nccl");
  EXPECT_EQ(config::get_string(Key::kHostId), "from-nccl");
  env.set("GW_HOSTID", "from-gw");
  EXPECT_EQ(config::get_string(Key::kHostId), "from-gw");
}

TEST(ConfigTest, BoolSpellings) {
  EnvGuard env;
  // No Bool row may exist yet; exercise the parser through validate() on any Bool row we find.
  for (const auto& r : config::table()) {
    if (r.type != config::Type::Bool) continue;
    for (const char* t : {"1", "true", "YES", "On"}) {
      env.set(r.name, t);
      EXPECT_TRUE(config::get_bool(r.key)) << t;
    }
    for (const char* f : {"0", "false", "No", "OFF"}) {
      env.set(r.name, f);
      EXPECT_FALSE(config::get_bool(r.key)) << f;
    }
    env.set(r.name, "maybe");
    EXPECT_FALSE(config::validate().ok());
    env.unset(r.name);
  }
}

TEST(ConfigTest, MalformedValuesFallBackToDefaultsAndValidateNamesThemAll) {
  EnvGuard env;
  env.set("GW_TIMEOUT_MS", "soon");
  env.set("GW_SOCKET_BUFSIZE", "4X");
  env.set("GW_COST_BW_GBPS", "fast");
  env.set("GW_SOCKET_NSOCKS", " 4");  // whitespace is not a number either
  EXPECT_EQ(config::get_int(Key::kTimeoutMs), 300000);
  EXPECT_EQ(config::get_int(Key::kSocketBufsize), 0);  // the default: kernel autotuning
  EXPECT_DOUBLE_EQ(config::get_double(Key::kCostBwGbps), 0.0);
  Status s = config::validate();
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), Code::kInvalidArg);
  for (const char* name : {"GW_TIMEOUT_MS=soon", "GW_SOCKET_BUFSIZE=4X", "GW_COST_BW_GBPS=fast",
                           "GW_SOCKET_NSOCKS= 4"}) {
    EXPECT_NE(s.message().find(name), std::string::npos) << name << " in " << s.message();
  }
  env.unset("GW_TIMEOUT_MS");
  env.unset("GW_SOCKET_BUFSIZE");
  env.unset("GW_COST_BW_GBPS");
  env.unset("GW_SOCKET_NSOCKS");
  EXPECT_TRUE(config::validate().ok());
}

TEST(ConfigTest, IntegersOutOfRangeAreRejected) {
  EnvGuard env;
  env.set("GW_TIMEOUT_MS", "99999999999999999999999");
  EXPECT_FALSE(config::validate().ok());
  EXPECT_EQ(config::get_int(Key::kTimeoutMs), 300000);
  // A size that does not fit in the int64 that get_int returns must not wrap negative.
  env.unset("GW_TIMEOUT_MS");
  env.set("GW_SOCKET_CHUNK", "9223372036854775808");
  EXPECT_FALSE(config::validate().ok());
  EXPECT_EQ(config::get_int(Key::kSocketChunk), 256 * 1024);
  env.set("GW_SOCKET_CHUNK", "8589934592G");  // 2^63
  EXPECT_FALSE(config::validate().ok());
  EXPECT_EQ(config::get_int(Key::kSocketChunk), 256 * 1024);
  env.set("GW_SOCKET_CHUNK", "8589934591G");  // just below 2^63: fine
  EXPECT_TRUE(config::validate().ok());
  EXPECT_GT(config::get_int(Key::kSocketChunk), 0);
}

TEST(ConfigTest, ParseSize) {
  EXPECT_EQ(*config::parse_size("0"), 0u);
  EXPECT_EQ(*config::parse_size("64"), 64u);
  EXPECT_EQ(*config::parse_size("4K"), 4096u);
  EXPECT_EQ(*config::parse_size("4k"), 4096u);
  EXPECT_EQ(*config::parse_size("1M"), 1u << 20);
  EXPECT_EQ(*config::parse_size("1MiB"), 1u << 20);
  EXPECT_EQ(*config::parse_size("2G"), 2ull << 30);
  EXPECT_EQ(*config::parse_size("7B"), 7u);
  for (const char* bad :
       {"", "K", "-1", "1.5M", "1T", "12 K", "0x10", "99999999999999999999", "17179869184G"}) {
    auto r = config::parse_size(bad);
    EXPECT_FALSE(r.ok()) << bad;
    if (!r.ok()) {
      EXPECT_EQ(r.status().code(), Code::kInvalidArg);
    }
  }
}

TEST(ConfigTest, TomlKeyAndDump) {
  EXPECT_EQ(config::toml_key(config::row(Key::kTimeoutMs)), "timeout_ms");
  EXPECT_EQ(config::toml_key(config::row(Key::kHostId)), "hostid");
  EnvGuard env;
  env.set("GW_SPIN_US", "7");
  std::string table = config::dump(false);
  std::string toml = config::dump(true);
  for (const auto& r : config::table()) {
    EXPECT_NE(table.find(r.name), std::string::npos) << r.name;
    EXPECT_NE(toml.find(config::toml_key(r) + " = "), std::string::npos) << r.name;
    EXPECT_NE(toml.find(r.help), std::string::npos) << r.name;
  }
  EXPECT_NE(toml.find("spin_us = 7\n"), std::string::npos);
  EXPECT_NE(toml.find("transport = \""), std::string::npos);  // strings are quoted
  EXPECT_NE(table.find("NCCL_HOSTID"), std::string::npos);    // aliases are shown
}

// docs/configuration.md must carry one line per row, exactly as printed here. On failure the
// expected table is printed: paste it into the document.
std::string markdown_row(const config::Row& r) {
  static const char* kTypes[] = {"int", "bool", "string", "size", "double"};
  std::string help = r.help;
  for (size_t p = help.find('|'); p != std::string::npos; p = help.find('|', p + 2)) {
    help.replace(p, 1, "\\|");
  }
  std::string alias = r.alias[0] ? std::string("`") + r.alias + "`" : "";
  std::string def = r.default_value[0] ? std::string("`") + r.default_value + "`" : "(empty)";
  return std::string("| `") + r.name + "` | " + alias + " | " + kTypes[static_cast<int>(r.type)] +
         " | " + def + " | " + help + " |";
}

TEST(ConfigTest, DocumentationListsEveryKnob) {
  std::string path = __FILE__;
  path = path.substr(0, path.rfind("tests/unit/")) + "docs/configuration.md";
  std::ifstream f(path);
  ASSERT_TRUE(f.good()) << "cannot read " << path;
  std::stringstream ss;
  ss << f.rdbuf();
  std::string doc = ss.str();
  std::string expected;
  bool missing = false;
  for (const auto& r : config::table()) {
    std::string line = markdown_row(r);
    expected += line + "\n";
    if (doc.find(line + "\n") == std::string::npos) {
      ADD_FAILURE() << path << " lacks or misstates " << r.name;
      missing = true;
    }
  }
  if (missing) std::cerr << "expected table rows:\n" << expected;
}

// --- status --------------------------------------------------------------------------------------

TEST(StatusTest, CodesAndText) {
  Status ok;
  EXPECT_TRUE(ok.ok());
  EXPECT_EQ(ok.to_string(), "OK");
  EXPECT_TRUE(ok.with_context("ctx").ok());
  Status p = peer_error("recv from rank {} ({})", 3, "10.0.0.2:4000");
  EXPECT_EQ(p.code(), Code::kPeer);
  EXPECT_EQ(p.to_string(), "PEER: recv from rank 3 (10.0.0.2:4000)");
  Status c = p.with_context("allreduce");
  EXPECT_EQ(c.code(), Code::kPeer);
  EXPECT_EQ(c.message(), "allreduce: recv from rank 3 (10.0.0.2:4000)");
  EXPECT_EQ(invalid_arg("x").code(), Code::kInvalidArg);
  EXPECT_EQ(timeout_error("x").code(), Code::kTimeout);
  EXPECT_EQ(unsupported("x").code(), Code::kUnsupported);
  EXPECT_EQ(no_memory("x").code(), Code::kNoMemory);
  EXPECT_EQ(aborted_error("x").code(), Code::kAborted);
  EXPECT_EQ(internal_error("x").code(), Code::kInternal);
  std::set<std::string> names;
  for (int i = 0; i <= static_cast<int>(Code::kInternal); ++i) {
    names.insert(code_name(static_cast<Code>(i)));
  }
  EXPECT_EQ(names.size(), 9u);
  EXPECT_STREQ(code_name(static_cast<Code>(42)), "UNKNOWN");
}

TEST(StatusTest, SystemErrorCarriesErrnoText) {
  Status s = system_error("open /nonexistent", ENOENT);
  EXPECT_EQ(s.code(), Code::kSystem);
  EXPECT_NE(s.message().find("open /nonexistent"), std::string::npos);
  EXPECT_NE(s.message().find("No such file"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("errno 2"), std::string::npos);
}

Result<int> half(int v) {
  if (v % 2) return invalid_arg("{} is odd", v);
  return v / 2;
}

Status quarter(int v, int* out) {
  GW_ASSIGN_OR_RETURN(int h, half(v));
  GW_ASSIGN_OR_RETURN(int q, half(h));
  *out = q;
  return ok_status();
}

Status chain(bool fail) {
  GW_RETURN_IF_ERROR(fail ? timeout_error("inner") : ok_status());
  return internal_error("reached the end");
}

TEST(StatusTest, ResultAndMacros) {
  Result<int> r = half(8);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, 4);
  EXPECT_TRUE(r.status().ok());
  Result<int> bad = half(3);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(), "3 is odd");
  int out = -1;
  EXPECT_TRUE(quarter(8, &out).ok());
  EXPECT_EQ(out, 2);
  out = -1;
  Status s = quarter(6, &out);  // 6 -> 3 -> odd
  EXPECT_EQ(s.code(), Code::kInvalidArg);
  EXPECT_EQ(out, -1);  // outputs untouched on failure
  EXPECT_EQ(chain(true).code(), Code::kTimeout);
  EXPECT_EQ(chain(false).code(), Code::kInternal);
  Result<std::string> moved = std::string("abc");
  std::string taken = std::move(moved).value();
  EXPECT_EQ(taken, "abc");
}

// --- log -----------------------------------------------------------------------------------------

TEST(LogTest, LevelFromEnvironment) {
  EnvGuard env;
  env.set("GW_LOG_LEVEL", "debug");
  log::reload_level();
  EXPECT_EQ(log::get().level(), spdlog::level::debug);
  env.set("GW_LOG_LEVEL", "warning");
  log::reload_level();
  EXPECT_EQ(log::get().level(), spdlog::level::warn);
  env.set("GW_LOG_LEVEL", "error");
  log::reload_level();
  EXPECT_EQ(log::get().level(), spdlog::level::err);
  log::set_rank(5);
  GW_LOG_INFO("not shown at error level {}", 1);
  env.unset("GW_LOG_LEVEL");
  log::reload_level();
  EXPECT_EQ(log::get().level(), spdlog::level::warn);
}

}  // namespace
}  // namespace gw
