// gradwired's engine (daemon/server.h) on a thread of the test process, its socket in a temporary
// directory: the base of daemon_server_test's and daemon_abuse_test's fixtures.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <memory>
#include <string>
#include <thread>

#include "daemon/server.h"

namespace gw::daemon::test {

class ServerFixture : public ::testing::Test {
 protected:
  // The options every test daemon starts from: a new temporary directory for its socket, host
  // "test-host", 8 ring entries, arenas up to 8 MiB.
  ServerOptions options(const char* dir_prefix) {
    std::string tmpl = std::string("/tmp/") + dir_prefix + "-XXXXXX";
    EXPECT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    ServerOptions o;
    o.socket_path = dir_ + "/gradwired.sock";
    o.host_id = "test-host";
    o.ring_entries = 8;
    o.max_arena_bytes = 8 << 20;
    return o;
  }

  // Creates the server with `o` and runs it on a thread until TearDown.
  void run(const ServerOptions& o) {
    auto s = Server::create(o);
    ASSERT_TRUE(s.ok()) << s.status().message();
    server_ = std::move(*s);
    thread_ = std::thread([this] { run_status_ = server_->run(); });
  }

  // Stops the server, which must have run without an error, and removes its directory.
  void TearDown() override {
    if (server_) server_->stop();
    if (thread_.joinable()) thread_.join();
    EXPECT_TRUE(run_status_.ok()) << run_status_.message();
    server_.reset();
    if (!dir_.empty()) ::rmdir(dir_.c_str());
  }

  std::string dir_;
  std::unique_ptr<Server> server_;
  std::thread thread_;
  Status run_status_;
};

}  // namespace gw::daemon::test
