// core/config (the registered rows and their layers: default < TOML file < environment < API),
// core/config_snapshot, core/status (Status, Result, macros) and core/log, plus a check that
// docs/configuration.md lists every registered row exactly as the row says.
#include "core/config.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "collectives/coll_config.h"
#include "collectives/compress/compress_config.h"
#include "core/config_snapshot.h"
#include "core/core_config.h"
#include "core/net/net_config.h"
#include "core/net/shm_config.h"
#include "core/net/tcp_config.h"
#include "daemon/daemon_config.h"
#include "kv/kv_config.h"
#include "plugin/plugin_config.h"
#if defined(GW_HAVE_DPDK)
#include "dpdk/dpdk_config.h"
#endif

#include "core/log.h"
#include "core/status.h"

namespace gw {
namespace {

namespace cc = core_config;
namespace tc = net::tcp_config;
namespace kc = coll::coll_config;

// Every component's set, linked and registered even where this test reads none of its rows.
[[maybe_unused]] const bool kAllRegistered = [] {
  cc::rows();
  net::net_config::rows();
  tc::rows();
  net::shm_config::rows();
  kc::rows();
  kv::kv_config::rows();
  coll::compress_config::rows();
  plugin::plugin_config::rows();
#if defined(GW_HAVE_DPDK)
  dpdk::dpdk_config::rows();
#endif
  return true;
}();

// Sets variables for one test and restores the previous environment (and clears the API layer)
// afterwards.
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
    config::clear_all();
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

// A TOML file in the test's temporary directory, removed afterwards. Each test writes its own
// path: the file layer is cached by path, size and modification time.
class TomlFile {
 public:
  TomlFile(const std::string& name, const std::string& text) {
    const char* dir = std::getenv("TMPDIR");
    path_ = fmt::format("{}/gw_config_test_{}_{}.toml", dir ? dir : "/tmp", getpid(), name);
    std::ofstream(path_) << text;
  }
  ~TomlFile() { std::remove(path_.c_str()); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

TEST(ConfigTest, TableIsConsistent) {
  const auto rows = config::table();
  ASSERT_FALSE(rows.empty());
  std::set<std::string> names, keys;
  for (const config::Row* r : rows) {
    EXPECT_EQ(std::string(r->name).rfind("GW_", 0), 0u) << r->name;
    EXPECT_TRUE(names.insert(r->name).second) << "duplicate " << r->name;
    EXPECT_TRUE(keys.insert(config::toml_key(*r)).second) << "duplicate key of " << r->name;
    EXPECT_STRNE(r->help, "") << r->name;
    EXPECT_NE(config::component_of(*r), "") << r->name;
    EXPECT_EQ(config::find(r->name), r);
    EXPECT_EQ(config::find(config::toml_key(*r)), r);
    // Every default parses as its own type (otherwise get_* would have nothing to fall back to).
    EXPECT_TRUE(config::check(*r, r->default_value).ok()) << r->name << " '" << r->default_value;
  }
  // Each component registered its set once, core's first.
  const auto sets = config::row_sets();
  ASSERT_FALSE(sets.empty());
  EXPECT_STREQ(sets.front()->component(), "core");
  std::set<std::string> components;
  for (const auto* s : sets) EXPECT_TRUE(components.insert(s->component()).second);
  for (const char* c : {"core", "net", "tcp", "shm", "collectives", "plugin"}) {
    EXPECT_TRUE(components.count(c)) << c;
  }
#if defined(GW_HAVE_DPDK)
  EXPECT_TRUE(components.count("dpdk"));
#else
  EXPECT_FALSE(components.count("dpdk"));  // no knob for a backend that is not built
  EXPECT_EQ(config::find("GW_DPDK_PORT"), nullptr);
#endif
}

TEST(ConfigTest, DefaultsAndOverrides) {
  EnvGuard env;
  env.unset("GW_TIMEOUT_MS");
  env.unset("GW_CONFIG_FILE");
  EXPECT_EQ(config::get_int(cc::kTimeoutMs), 300000);
  EXPECT_FALSE(config::raw(cc::kTimeoutMs).has_value());
  env.set("GW_TIMEOUT_MS", "1234");
  EXPECT_EQ(config::get_int(cc::kTimeoutMs), 1234);
  EXPECT_EQ(*config::raw(cc::kTimeoutMs), "1234");
  env.unset("GW_SOCKET_CHUNK");
  EXPECT_EQ(config::get_int(tc::kSocketChunk), 256 * 1024);
  env.set("GW_SOCKET_CHUNK", "2M");
  EXPECT_EQ(config::get_int(tc::kSocketChunk), 2 * 1024 * 1024);
  env.set("GW_COST_ALPHA_US", "2.5");
  EXPECT_DOUBLE_EQ(config::get_double(kc::kCostAlphaUs), 2.5);
  env.set("GW_TRANSPORT", "tcp");
  EXPECT_EQ(config::get_string(net::net_config::kTransport), "tcp");
}

TEST(ConfigTest, AliasIsHonouredWhenTheMainNameIsUnset) {
  EnvGuard env;
  env.unset("GW_HOSTID");
  env.unset("NCCL_HOSTID");
  EXPECT_EQ(config::get_string(cc::kHostId), "");
  env.set("NCCL_HOSTID", "from-nccl");
  EXPECT_EQ(config::get_string(cc::kHostId), "from-nccl");
  EXPECT_EQ(config::source_text(config::resolve(cc::kHostId)), "env NCCL_HOSTID");
  env.set("GW_HOSTID", "from-gw");
  EXPECT_EQ(config::get_string(cc::kHostId), "from-gw");
  EXPECT_EQ(config::source_text(config::resolve(cc::kHostId)), "env");
}

TEST(ConfigTest, BoolSpellings) {
  EnvGuard env;
  for (const config::Row* r : config::table()) {
    if (r->type != config::Type::Bool) continue;
    for (const char* t : {"1", "true", "YES", "On"}) {
      env.set(r->name, t);
      EXPECT_TRUE(config::get_bool(*r)) << t;
    }
    for (const char* f : {"0", "false", "No", "OFF"}) {
      env.set(r->name, f);
      EXPECT_FALSE(config::get_bool(*r)) << f;
    }
    env.set(r->name, "maybe");
    EXPECT_FALSE(config::validate().ok());
    env.unset(r->name);
  }
}

TEST(ConfigTest, MalformedValuesFallBackToDefaultsAndValidateNamesThemAll) {
  EnvGuard env;
  env.set("GW_TIMEOUT_MS", "soon");
  env.set("GW_SOCKET_BUFSIZE", "4X");
  env.set("GW_COST_BW_GBPS", "fast");
  env.set("GW_SOCKET_NSOCKS", " 4");  // whitespace is not a number either
  EXPECT_EQ(config::get_int(cc::kTimeoutMs), 300000);
  EXPECT_EQ(config::get_int(tc::kSocketBufsize), 0);  // the default: kernel autotuning
  EXPECT_DOUBLE_EQ(config::get_double(kc::kCostBwGbps), 0.0);
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
  EXPECT_EQ(config::get_int(cc::kTimeoutMs), 300000);
  // A size that does not fit in the int64 that get_int returns must not wrap negative.
  env.unset("GW_TIMEOUT_MS");
  env.set("GW_SOCKET_CHUNK", "9223372036854775808");
  EXPECT_FALSE(config::validate().ok());
  EXPECT_EQ(config::get_int(tc::kSocketChunk), 256 * 1024);
  env.set("GW_SOCKET_CHUNK", "8589934592G");  // 2^63
  EXPECT_FALSE(config::validate().ok());
  EXPECT_EQ(config::get_int(tc::kSocketChunk), 256 * 1024);
  env.set("GW_SOCKET_CHUNK", "8589934591G");  // just below 2^63: fine
  EXPECT_TRUE(config::validate().ok());
  EXPECT_GT(config::get_int(tc::kSocketChunk), 0);
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
  EXPECT_EQ(config::toml_key(cc::kTimeoutMs), "timeout_ms");
  EXPECT_EQ(config::toml_key(cc::kHostId), "hostid");
  EnvGuard env;
  env.unset("GW_CONFIG_FILE");
  env.set("GW_SPIN_US", "7");
  std::string table = config::dump(false);
  std::string toml = config::dump(true);
  for (const config::Row* r : config::table()) {
    EXPECT_NE(table.find(r->name), std::string::npos) << r->name;
    EXPECT_NE(toml.find(config::toml_key(*r) + " = "), std::string::npos) << r->name;
    EXPECT_NE(toml.find(r->help), std::string::npos) << r->name;
  }
  EXPECT_NE(toml.find("spin_us = 7\n"), std::string::npos);
  EXPECT_NE(toml.find("transport = \""), std::string::npos);       // strings are quoted
  EXPECT_NE(toml.find("plugin_pin = true\n"), std::string::npos);  // booleans as TOML booleans
  EXPECT_NE(table.find("NCCL_HOSTID"), std::string::npos);         // aliases are shown
}

// The settings lines (not comments) of a TOML dump.
std::string settings_of(const std::string& toml) {
  std::istringstream in(toml);
  std::string line, out;
  while (std::getline(in, line)) {
    if (!line.empty() && line[0] != '#') out += line + "\n";
  }
  return out;
}

// The TOML dump loads back and dumps the same settings (issue 34, item 4), whatever the strings
// hold (quotes, backslashes, control and non-ASCII characters); what no file may set (the file's
// own name, the secret token, rows only the NCCL plugin reads) stays a comment.
TEST(ConfigTest, TomlDumpLoadsBackAndDumpsTheSame) {
  EnvGuard env;
  env.unset("GW_CONFIG_FILE");
  const std::string host = "a \"quoted\" \\ host\t\xc3\xa9\xe3\x80\x81\xf0\x9f\x99\x82";
  const std::map<std::string, std::string> vars = {{"GW_SPIN_US", "7"},
                                                   {"GW_HOSTID", host},
                                                   {"GW_COST_BW_GBPS", "2.5"},
                                                   {"GW_SOCKET_CHUNK", "512K"},
                                                   {"GW_PLUGIN_PIN", "0"}};
  for (const auto& [k, v] : vars) env.set(k.c_str(), v.c_str());
  env.set("GW_JOB_TOKEN", "the-secret-value");
  const std::string first = config::dump(true);
  EXPECT_EQ(first.find("the-secret-value"), std::string::npos) << first;
  EXPECT_NE(first.find("\n# job_token = (set)\n"), std::string::npos) << first;
  EXPECT_NE(first.find("\n# config_file = \"\"\n"), std::string::npos) << first;
  EXPECT_NE(first.find("\n# plugin_pin = false\n"), std::string::npos) << first;
  const std::string settings = settings_of(first);
  EXPECT_EQ(settings.find("plugin_"), std::string::npos) << settings;
  EXPECT_NE(settings.find("spin_us = 7\n"), std::string::npos) << settings;

  TomlFile f("roundtrip", first);
  for (const auto& [k, v] : vars) env.unset(k.c_str());
  env.set("GW_CONFIG_FILE", f.path().c_str());
  ASSERT_TRUE(config::validate().ok()) << config::validate().to_string();
  EXPECT_EQ(config::get_string(cc::kHostId), host);
  EXPECT_EQ(config::get_int(kc::kSpinUs), 7);
  EXPECT_EQ(config::source_text(config::resolve(cc::kHostId)).rfind(f.path() + ":", 0), 0u);
  EXPECT_EQ(settings_of(config::dump(true)), settings);
}

// The layers: default < file < environment < API, each value saying where it came from.
TEST(ConfigTest, FileEnvironmentAndApiLayers) {
  EnvGuard env;
  for (const char* v : {"GW_TIMEOUT_MS", "GW_SOCKET_CHUNK", "GW_ALGO", "GW_COST_BW_GBPS",
                        "GW_PLUGIN_PIN", "GW_SOCKET_NSOCKS", "GW_SPIN_US"}) {
    env.unset(v);
  }
  TomlFile f("layers",
             "# settings\n"
             "timeout_ms = 60000\n"
             "algo = \"ring\"\n"
             "cost_bw_gbps = 3\n"
             "plugin_pin = false\n"
             "\n"
             "[socket]\n"
             "chunk = \"2M\"\n"
             "nsocks = 2\n");
  env.set("GW_CONFIG_FILE", f.path().c_str());
  ASSERT_TRUE(config::validate().ok()) << config::validate().to_string();
  EXPECT_EQ(config::get_int(cc::kTimeoutMs), 60000);
  EXPECT_EQ(config::get_string(kc::kAlgo), "ring");
  EXPECT_DOUBLE_EQ(config::get_double(kc::kCostBwGbps), 3.0);
  EXPECT_FALSE(config::get_bool(plugin::plugin_config::kPluginPin));
  EXPECT_EQ(config::get_int(tc::kSocketChunk), 2 << 20);  // [socket] chunk -> GW_SOCKET_CHUNK
  EXPECT_EQ(config::get_int(tc::kSocketNsocks), 2);
  EXPECT_EQ(config::get_int(kc::kSpinUs), 50);  // not in the file: the default
  EXPECT_EQ(config::source_text(config::resolve(cc::kTimeoutMs)), f.path() + ":2");
  EXPECT_EQ(config::source_text(config::resolve(tc::kSocketChunk)), f.path() + ":8");
  EXPECT_EQ(config::source_text(config::resolve(kc::kSpinUs)), "default");
  EXPECT_EQ(*config::raw(cc::kTimeoutMs), "60000");  // the file sets it explicitly

  // The environment beats the file...
  env.set("GW_TIMEOUT_MS", "5000");
  EXPECT_EQ(config::get_int(cc::kTimeoutMs), 5000);
  EXPECT_EQ(config::resolve(cc::kTimeoutMs).source, config::Source::kEnv);
  // ...and the API beats the environment.
  ASSERT_TRUE(config::set(cc::kTimeoutMs, "777").ok());
  EXPECT_EQ(config::get_int(cc::kTimeoutMs), 777);
  EXPECT_EQ(config::source_text(config::resolve(cc::kTimeoutMs)), "api");
  ASSERT_TRUE(config::set("algo", "rhd").ok());  // by TOML key or by variable name
  EXPECT_EQ(config::get_string(kc::kAlgo), "rhd");
  config::clear(cc::kTimeoutMs);
  EXPECT_EQ(config::get_int(cc::kTimeoutMs), 5000);

  // An API value must parse; an unknown name is refused.
  Status bad = config::set(cc::kTimeoutMs, "soon");
  EXPECT_EQ(bad.code(), Code::kInvalidArg);
  EXPECT_NE(bad.message().find("GW_TIMEOUT_MS=soon"), std::string::npos) << bad.message();
  EXPECT_EQ(config::get_int(cc::kTimeoutMs), 5000);
  EXPECT_EQ(config::set("GW_NO_SUCH_KNOB", "1").code(), Code::kInvalidArg);

  // dump() says where each value came from.
  const std::string table = config::dump(false);
  auto line_of = [&](const std::string& name) {
    size_t p = table.find("\n" + name + " ");
    return p == std::string::npos ? std::string()
                                  : table.substr(p + 1, table.find('\n', p + 1) - p);
  };
  EXPECT_NE(line_of("GW_TIMEOUT_MS").find(" env "), std::string::npos) << table;
  EXPECT_NE(line_of("GW_ALGO").find(" api "), std::string::npos) << table;
  EXPECT_NE(line_of("GW_SOCKET_CHUNK").find(f.path() + ":8"), std::string::npos) << table;
  EXPECT_NE(line_of("GW_SPIN_US").find(" default "), std::string::npos) << table;
}

TEST(ConfigTest, FileErrorsNameFileLineAndKey) {
  EnvGuard env;
  env.unset("GW_TIMEOUT_MS");
  env.unset("GW_SOCKET_BUFSIZE");
  TomlFile f("errors",
             "timeout_ms = \"soon\"\n"  // line 1: wrong type (a string for an int)
             "no_such_knob = 1\n"       // line 2: unknown key
             "[socket]\n"
             "bufsize = \"4X\"\n"       // line 4: right type, malformed size
             "config_file = \"x\"\n");  // line 5: socket_config_file: unknown
  env.set("GW_CONFIG_FILE", f.path().c_str());
  Status s = config::validate();
  ASSERT_EQ(s.code(), Code::kInvalidArg) << s.to_string();
  for (const std::string& want :
       {f.path() + ":1: key 'timeout_ms': expected an integer, got string",
        f.path() + ":2: key 'no_such_knob': unknown key",
        f.path() + ":4: key 'socket_bufsize' = \"4X\"",
        f.path() + ":5: key 'socket_config_file': unknown key"}) {
    EXPECT_NE(s.message().find(want), std::string::npos) << want << "\nin " << s.message();
  }
  // Values of the wrong type are not used; malformed ones fall back to the default.
  EXPECT_EQ(config::get_int(cc::kTimeoutMs), 300000);
  EXPECT_EQ(config::get_int(tc::kSocketBufsize), 0);

  TomlFile syntax("syntax", "timeout_ms = 1\nalgo = \n");
  env.set("GW_CONFIG_FILE", syntax.path().c_str());
  s = config::validate();
  ASSERT_EQ(s.code(), Code::kInvalidArg);
  EXPECT_NE(s.message().find(syntax.path() + ":2:"), std::string::npos) << s.message();

  env.set("GW_CONFIG_FILE", "/nonexistent/gradwire.toml");
  s = config::validate();
  ASSERT_EQ(s.code(), Code::kInvalidArg);
  EXPECT_NE(s.message().find("/nonexistent/gradwire.toml: cannot read"), std::string::npos)
      << s.message();

  TomlFile self("self", "config_file = \"other.toml\"\n");
  env.set("GW_CONFIG_FILE", self.path().c_str());
  s = config::validate();
  EXPECT_NE(s.message().find(self.path() + ":1: key 'config_file': unknown key"), std::string::npos)
      << s.message();
}

TEST(ConfigTest, SnapshotIsImmutableAndCheapToShare) {
  EnvGuard env;
  env.unset("GW_CONFIG_FILE");
  env.set("GW_NCHANNELS", "3");
  config::Snapshot snap = config::Snapshot::capture();
  config::Snapshot copy = snap;
  env.set("GW_NCHANNELS", "5");
  ASSERT_TRUE(config::set(kc::kAlgo, "ring").ok());
  EXPECT_EQ(snap.get_int(kc::kNchannels), 3);  // captured before the change
  EXPECT_EQ(copy.get_int(kc::kNchannels), 3);
  EXPECT_EQ(snap.get_string(kc::kAlgo), "auto");
  EXPECT_EQ(snap.source(kc::kNchannels), config::Source::kEnv);
  EXPECT_EQ(config::Snapshot::capture().get_int(kc::kNchannels), 5);
  EXPECT_EQ(config::Snapshot::capture().get_string(kc::kAlgo), "ring");

  auto with = snap.with(kc::kNchannels, "8");
  ASSERT_TRUE(with.ok());
  EXPECT_EQ(with->get_int(kc::kNchannels), 8);
  EXPECT_EQ(with->source(kc::kNchannels), config::Source::kApi);
  EXPECT_EQ(snap.get_int(kc::kNchannels), 3);
  EXPECT_EQ(snap.with(kc::kNchannels, "many").status().code(), Code::kInvalidArg);

  // A snapshot keeps the problems it saw.
  env.set("GW_SPIN_US", "lots");
  config::Snapshot bad = config::Snapshot::capture();
  env.unset("GW_SPIN_US");
  EXPECT_NE(bad.validate().message().find("GW_SPIN_US=lots"), std::string::npos);
  EXPECT_TRUE(config::Snapshot::capture().validate().ok());
  EXPECT_TRUE(config::Snapshot().empty());
  EXPECT_FALSE(snap.empty());
}

// docs/configuration.md must carry one line per registered row, exactly as printed here, and
// list no row that its component does not register. On failure the expected table is printed:
// paste it into the document.
std::string markdown_row(const config::Row& r) {
  std::string help = r.help;
  for (size_t p = help.find('|'); p != std::string::npos; p = help.find('|', p + 2)) {
    help.replace(p, 1, "\\|");
  }
  std::string alias = r.alias[0] ? std::string("`") + r.alias + "`" : "";
  std::string def = r.default_value[0] ? std::string("`") + r.default_value + "`" : "(empty)";
  return "| " + config::component_of(r) + " | `" + r.name + "` | " + alias + " | " +
         config::type_name(r.type) + " | " + def + " | " + help + " |";
}

TEST(ConfigTest, DocumentationListsEveryKnob) {
  std::string path = std::string(GW_SOURCE_DIR) + "/docs/configuration.md";
  std::ifstream f(path);
  ASSERT_TRUE(f.good()) << "cannot read " << path;
  std::stringstream ss;
  ss << f.rdbuf();
  std::string doc = ss.str();
  std::string expected;
  bool missing = false;
  for (const config::Row* r : config::table()) {
    std::string line = markdown_row(*r);
    expected += line + "\n";
    if (doc.find(line + "\n") == std::string::npos) {
      ADD_FAILURE() << path << " lacks or misstates " << r->name;
      missing = true;
    }
  }
  if (missing) std::cerr << "expected table rows:\n" << expected;
  // Rows the document lists for a component this program registers must exist.
  std::set<std::string> components;
  for (const auto* s : config::row_sets()) components.insert(s->component());
  std::istringstream in(doc);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("| ", 0) != 0) continue;
    size_t a = line.find(" | `GW_");
    if (a == std::string::npos) continue;
    std::string component = line.substr(2, a - 2);
    std::string name = line.substr(a + 4, line.find('`', a + 4) - a - 4);
    if (!components.count(component)) continue;  // a component this build lacks (dpdk)
    const config::Row* r = config::find(name);
    EXPECT_TRUE(r != nullptr && config::component_of(*r) == component)
        << path << " lists " << name << " under " << component << ", which has no such row";
  }
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

// A truncated message is told by its reason (the executor's count check), never by its text;
// the code, which the C ABI and the daemon protocol carry, stays kInvalidArg.
TEST(StatusTest, TruncatedIsAReasonNotAText) {
  Status t = truncated_error("recv from rank 1: message truncated");
  EXPECT_EQ(t.code(), Code::kInvalidArg);
  EXPECT_EQ(t.reason(), Reason::kTruncated);
  EXPECT_TRUE(t.truncated());
  Status c = t.with_context("allreduce");
  EXPECT_TRUE(c.truncated());
  EXPECT_EQ(c.message(), "allreduce: recv from rank 1: message truncated");
  EXPECT_FALSE(invalid_arg("message truncated").truncated());
  EXPECT_FALSE(Status(Code::kInvalidArg, "x").truncated());
  EXPECT_FALSE(ok_status().truncated());
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

// NCCL users write NCCL_DEBUG=INFO; GW_LOG_LEVEL=INFO used to turn logging off, errors included.
TEST(LogTest, LevelsAreCaseInsensitiveAndUnknownOnesAreAnErrorNotSilence) {
  EnvGuard env;
  env.set("GW_LOG_LEVEL", "INFO");
  EXPECT_TRUE(config::validate().ok());
  log::reload_level();
  EXPECT_EQ(log::get().level(), spdlog::level::info);
  env.set("GW_LOG_LEVEL", "Trace");
  log::reload_level();
  EXPECT_EQ(log::get().level(), spdlog::level::trace);
  env.set("GW_LOG_LEVEL", "verbose");
  Status s = config::validate();
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("GW_LOG_LEVEL=verbose: unknown log level"), std::string::npos)
      << s.message();
  log::reload_level();
  EXPECT_EQ(log::get().level(), spdlog::level::warn);  // the default, never off
  EXPECT_FALSE(config::set(cc::kLogLevel, "loud").ok());
  env.unset("GW_LOG_LEVEL");
  log::reload_level();
}

// 9.2e12 ms used to pass and overflow the deadline (init then timed out at once).
TEST(ConfigTest, TimeoutsThatWouldOverflowADeadlineAreRefused) {
  EnvGuard env;
  for (const char* bad : {"9300000000000", "2147483648", "0", "-5"}) {
    env.set("GW_TIMEOUT_MS", bad);
    Status s = config::validate();
    EXPECT_FALSE(s.ok()) << bad;
    EXPECT_NE(s.message().find("timeout must be 1..2147483647 ms"), std::string::npos)
        << s.message();
    EXPECT_EQ(config::get_int(cc::kTimeoutMs), 300000) << bad;
  }
  env.set("GW_TIMEOUT_MS", "2147483647");
  EXPECT_TRUE(config::validate().ok());
}

}  // namespace
}  // namespace gw
