// The backend registry (core/net/backend_registry.h) and the one `auto` rule
// (core/net/auto_backend.h): what auto picks, what an unavailable backend says, and that every
// place that lists the backends lists the registry's names.
#include "core/net/backend_registry.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/net/auto_backend.h"
#include "core/net/net_config.h"
#include "core/net/transport.h"
#include "plugin/plugin_config.h"

namespace gw::net {
namespace {

AutoCandidate candidate(const std::string& name, int priority, bool within, bool across,
                        Status status = ok_status()) {
  AutoCandidate c;
  c.name = name;
  c.priority = priority;
  c.within_host = within;
  c.across_hosts = across;
  c.status = std::move(status);
  return c;
}

// The registry's own tcp, shm and dpdk entries, as candidates.
std::vector<AutoCandidate> today(Status shm_status = ok_status()) {
  return {candidate("tcp", 10, true, true), candidate("shm", 20, true, false, shm_status),
          candidate("dpdk", 0, false, false)};
}

TEST(AutoRule, ShmWithinAHostTcpAcrossHosts) {
  auto same = choose_auto(true, today());
  ASSERT_TRUE(same.ok()) << same.status().to_string();
  EXPECT_EQ(same->name, "shm");
  EXPECT_NE(same->reason.find("this host"), std::string::npos) << same->reason;
  auto other = choose_auto(false, today());
  ASSERT_TRUE(other.ok()) << other.status().to_string();
  EXPECT_EQ(other->name, "tcp");
  EXPECT_NE(other->reason.find("another host"), std::string::npos) << other->reason;
}

TEST(AutoRule, FallsBackFromShmToTcpAndSaysWhy) {
  auto c = choose_auto(true, today(unsupported("no /dev/shm here")));
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->name, "tcp");
  EXPECT_NE(c->reason.find("shm unavailable: no /dev/shm here"), std::string::npos) << c->reason;
}

TEST(AutoRule, NeverPicksABackendOnlyNamedAndTiesGoToTheFirstRegistered) {
  std::vector<AutoCandidate> only_dpdk = {candidate("dpdk", 100, false, false)};
  auto c = choose_auto(false, only_dpdk);
  EXPECT_EQ(c.status().code(), Code::kUnsupported);
  auto tie = choose_auto(false, {candidate("a", 5, false, true), candidate("b", 5, false, true)});
  ASSERT_TRUE(tie.ok());
  EXPECT_EQ(tie->name, "a");
  // A better backend across hosts wins over tcp when available, and loses with its reason.
  auto with_fast = today();
  with_fast.push_back(candidate("fast", 30, false, true, unsupported("no device")));
  auto lost = choose_auto(false, with_fast);
  ASSERT_TRUE(lost.ok());
  EXPECT_EQ(lost->name, "tcp");
  EXPECT_NE(lost->reason.find("fast unavailable: no device"), std::string::npos) << lost->reason;
  with_fast.back().status = ok_status();
  EXPECT_EQ(choose_auto(false, with_fast)->name, "fast");
  EXPECT_EQ(choose_auto(true, with_fast)->name, "shm");
}

TEST(AutoRule, NothingAvailableListsEveryReason) {
  auto c = choose_auto(true, {candidate("tcp", 10, true, true, unsupported("no sockets")),
                              candidate("shm", 20, true, false, unsupported("no memfd"))});
  ASSERT_EQ(c.status().code(), Code::kUnsupported);
  EXPECT_NE(c.status().message().find("no sockets"), std::string::npos);
  EXPECT_NE(c.status().message().find("no memfd"), std::string::npos);
}

// Whether this build has the verbs backend (gw_backends registered its factory).
bool verbs_built() {
  auto b = find_backend("verbs");
  return b.ok() && static_cast<bool>(b->factory);
}

TEST(AutoRule, OverTheRegistryItIsTodaysRule) {
  EXPECT_EQ(choose_auto_backend(true)->name, "shm");
  // verbs, where built and usable (an RDMA device, or the emulator), goes first across hosts.
  EXPECT_EQ(choose_auto_backend(false)->name, backend_status("verbs").ok() ? "verbs" : "tcp");
  EXPECT_EQ(choose_auto_backend(false, {"verbs"})->name, "tcp");
  // A backend whose factory failed with kUnsupported is left out: shm -> tcp.
  auto c = choose_auto_backend(true, {"shm"});
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->name, "tcp");
  EXPECT_EQ(describe_auto_rule(),
            verbs_built() ? "within a host: shm, else tcp; across hosts: verbs, else tcp"
                          : "within a host: shm, else tcp; across hosts: tcp");
}

TEST(BackendRegistry, BuiltInsComeFirstAndCannotBeReplaced) {
  std::vector<std::string> names = backend_names();
  ASSERT_GE(names.size(), 2u);
  EXPECT_EQ(names[0], "tcp");
  EXPECT_EQ(names[1], "shm");
  EXPECT_EQ(register_backend(unbuilt_backend("tcp", "x")).code(), Code::kInvalidArg);
  EXPECT_EQ(register_backend(unbuilt_backend("auto", "x")).code(), Code::kInvalidArg);
  EXPECT_EQ(register_backend(unbuilt_backend("", "x")).code(), Code::kInvalidArg);
}

TEST(BackendRegistry, UnavailableBackendGivesItsReason) {
  ASSERT_TRUE(
      register_backend(unbuilt_backend("test-unbuilt", "not built: GW_WITH_TEST=OFF")).ok());
  Status s = backend_status("test-unbuilt");
  EXPECT_EQ(s.code(), Code::kUnsupported);
  EXPECT_EQ(s.message(), "not built: GW_WITH_TEST=OFF");
  TransportOptions o;
  o.job_token = "t";
  auto t = make_transport("test-unbuilt", o);
  ASSERT_EQ(t.status().code(), Code::kUnsupported);
  EXPECT_NE(t.status().message().find("test-unbuilt"), std::string::npos);
  EXPECT_NE(t.status().message().find("not built: GW_WITH_TEST=OFF"), std::string::npos);
  EXPECT_TRUE(check_backend_name("test-unbuilt", "x").ok());
  EXPECT_NE(describe_backends().find("test-unbuilt (not built: GW_WITH_TEST=OFF)"),
            std::string::npos);
  // Known but never picked by auto.
  EXPECT_EQ(choose_auto_backend(true)->name, "shm");
}

TEST(BackendRegistry, DpdkAndVerbsAreKnownEvenWhenNotBuilt) {
  std::vector<std::string> names = backend_names();
  for (const char* n : {"dpdk", "verbs"}) {
    EXPECT_NE(std::find(names.begin(), names.end(), n), names.end()) << n;
    Status s = backend_status(n);
    auto b = find_backend(n);
    ASSERT_TRUE(b.ok());
    if (!s.ok()) {
      EXPECT_EQ(s.code(), Code::kUnsupported);
      // A backend that is built but unusable here (verbs without RDMA) says why instead.
      if (!b->factory) {
        EXPECT_EQ(s.message().rfind("not built: ", 0), 0u) << s.message();
      }
      EXPECT_FALSE(s.message().empty());
    }
  }
  // dpdk owns a port: only by name, never by auto (the NCCL plugin too takes it only by name).
  auto dpdk = find_backend("dpdk");
  ASSERT_TRUE(dpdk.ok());
  EXPECT_FALSE(dpdk->auto_within_host);
  EXPECT_FALSE(dpdk->auto_across_hosts);
  // verbs, when built: auto's first choice across hosts, never picked within a host.
  if (verbs_built()) {
    auto verbs = find_backend("verbs");
    auto tcp = find_backend("tcp");
    ASSERT_TRUE(verbs.ok() && tcp.ok());
    EXPECT_FALSE(verbs->auto_within_host);
    EXPECT_TRUE(verbs->auto_across_hosts);
    EXPECT_GT(verbs->auto_priority, tcp->auto_priority);
  }
}

TEST(BackendRegistry, UnknownNameListsTheRegisteredNames) {
  Status s = check_backend_name("carrier-pigeon", "communicator: transport");
  ASSERT_EQ(s.code(), Code::kInvalidArg);
  for (const std::string& n : backend_names()) {
    EXPECT_NE(s.message().find(n), std::string::npos) << n << ": " << s.message();
  }
  EXPECT_NE(s.message().find("communicator: transport 'carrier-pigeon'"), std::string::npos);
  EXPECT_EQ(find_backend("carrier-pigeon").status().code(), Code::kInvalidArg);
  EXPECT_TRUE(check_backend_name("auto", "x").ok());
}

// The backends named in include/gradwire/gradwire.h's comment on gw_config_t.transport.
std::vector<std::string> header_transport_names() {
  std::ifstream f(std::string(GW_SOURCE_DIR) + "/include/gradwire/gradwire.h");
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string text = ss.str();
  const size_t at = text.find("const char* transport;");
  if (at == std::string::npos) return {};
  const size_t end = text.find("*/", at);
  const std::string comment = text.substr(at, end - at);
  std::vector<std::string> names;
  std::regex quoted("\"([a-z0-9_-]+)\"");
  for (auto it = std::sregex_iterator(comment.begin(), comment.end(), quoted);
       it != std::sregex_iterator(); ++it) {
    if ((*it)[1] != "auto") names.push_back((*it)[1]);
  }
  return names;
}

TEST(BackendRegistry, CHeaderNamesTheRegisteredBackends) {
  std::vector<std::string> registered;
  for (const std::string& n : backend_names()) {
    if (n.rfind("test-", 0) != 0) registered.push_back(n);  // this file's own doubles
  }
  EXPECT_EQ(header_transport_names(), registered)
      << "include/gradwire/gradwire.h: gw_config_t.transport's comment must list the backends "
         "the registry knows (gw_backends: cmake/backends.cmake)";
}

TEST(BackendRegistry, DumpConfigCompletesTheBackendRowsFromTheRegistry) {
  const std::string table = config::dump(false);
  const std::string transport_help = config::help(net_config::kTransport);
  EXPECT_NE(table.find(transport_help), std::string::npos);
  EXPECT_NE(transport_help.find(describe_backends()), std::string::npos) << transport_help;
  for (const std::string& n : backend_names()) {
    EXPECT_NE(transport_help.find(n), std::string::npos) << n;
  }
  const std::string plugin_help = config::help(plugin::plugin_config::kPluginBackend);
  const std::string cross = verbs_built() ? "auto (across hosts: verbs, else tcp), tcp, verbs"
                                          : "auto (across hosts: tcp), tcp";
  EXPECT_NE(plugin_help.find(cross), std::string::npos) << plugin_help;
  EXPECT_EQ(plugin_help.find("shm"), std::string::npos) << plugin_help;
}

}  // namespace
}  // namespace gw::net
