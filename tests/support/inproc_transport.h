// An in-process Transport for tests that run ranks as threads of one process (gloo's style).
// It moves real bytes and keeps the whole core/net/transport.h contract: one-way connections,
// FIFO matching, tags (mismatch fails both requests with kInternal "tag mismatch"), truncation
// (kInvalidArg "message truncated" on both sides), kMaxRequests in flight per comm, 0-byte
// messages, job-token check at connect (kPeer), peer close -> kPeer, connector -> kTimeout.
//
// A send completes when its receive has been posted and the bytes were copied (rendezvous), so a
// sender never runs ahead of its receiver. Listeners live in one process-wide registry guarded by
// a mutex; handles are only meaningful inside the process that made them.
#pragma once

#include <memory>

#include "core/net/transport.h"

namespace gw::testing {

std::unique_ptr<net::Transport> make_inproc_transport(const net::TransportOptions& options);

}  // namespace gw::testing
