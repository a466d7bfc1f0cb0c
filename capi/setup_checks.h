// The checks a rank makes alone before it meets the others (the rendezvous), for both session
// kinds, and how a rank that fails one tells the others: under the keys they read next in the
// job's store, so they fail at once naming it instead of waiting out GW_TIMEOUT_MS.
#pragma once

#include <string>

#include "capi/session.h"
#include "core/status.h"

namespace gw::capi {

// Says `why` (a failure of this rank's own checks, before the rendezvous) in the job's store when
// there is one (rank 0 opens it, hosting it until the others have read it, 2 s at most), then
// returns `why` whatever the store said. Blocks at most about 2 s beyond opening the store.
Status fail_before_rendezvous(const SessionOptions& options, const Status& why);

// Daemon mode's local checks: the settings (config::validate), GW_DAEMON's form (unix:PATH, a
// path a unix socket can have), and a socket file at PATH. A file that is not there yet is waited
// for up to a second (a daemon started just before its trainers); then daemon::no_daemon_error
// (kPeer, the answer Client::connect gives a socket file nobody listens on: the setting may be
// right, the daemon is what is missing). A malformed GW_DAEMON or a path that is not a socket is
// kInvalidArg. Does not connect: the daemon sees no connection without a hello.
Status check_daemon_locally(const std::string& address);

}  // namespace gw::capi
