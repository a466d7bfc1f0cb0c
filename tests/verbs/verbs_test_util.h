// What the verbs backend's tests share: a connected pair of comms from one transport, and polling
// a request to its end. Every wait is bounded (10 s).
#pragma once

#include <gtest/gtest.h>

#include <memory>

#include "core/net/transport.h"
#include "tests/support/test_env.h"

namespace gw::verbs::test {

struct Pair {
  std::unique_ptr<net::Listener> listener;
  std::unique_ptr<net::SendComm> send;
  std::unique_ptr<net::RecvComm> recv;
};

// Listens and connects on `t`, polling both sides until each has its comm.
inline Pair connect_pair(net::Transport& t) {
  Pair p;
  net::Handle h;
  auto l = t.listen(&h);
  EXPECT_TRUE(l.ok()) << l.status().to_string();
  if (!l.ok()) return p;
  p.listener = std::move(*l);
  auto c = t.connect(h);
  EXPECT_TRUE(c.ok()) << c.status().to_string();
  if (!c.ok()) return p;
  int64_t end = ::gw::testing::now_ms() + 10000;
  while ((!p.send || !p.recv) && ::gw::testing::now_ms() < end) {
    if (!p.send) p.send = std::move(*(*c)->poll());
    if (!p.recv) p.recv = std::move(*p.listener->accept());
  }
  return p;
}

// Polls until the request finishes; its status.
inline Status finish(net::Comm* c, net::Request* r) {
  int64_t end = ::gw::testing::now_ms() + 10000;
  while (::gw::testing::now_ms() < end) {
    bool done = false;
    Status s = c->test(r, &done, nullptr);
    if (!s.ok() || done) return s;
  }
  return timeout_error("request did not finish");
}

}  // namespace gw::verbs::test
