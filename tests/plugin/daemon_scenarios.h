// nccl_plugin_peer's scenarios of daemon mode (GW_DAEMON; plugin/daemon_transport.h), each in a
// process of its own (daemon_scenarios.cc):
//   connect HEX fail   connecting to the handle HEX must fail (ncclSystemError) within 15 s with
//                      a WARN naming GW_JOB_TOKEN (run with another job's token)
//   connect HEX send   connect to HEX and send 4096 bytes (pattern seed 77, tag 3), then close
//   connect HEX die    connect to HEX, wait 300 ms, then SIGKILL itself (a rank killed
//                      while its peer's receive is in flight)
//   daemon-dies PATH   start gradwired (PATH) of its own, connect a pair through it, post a
//                      receive, SIGKILL the daemon: test() must fail within 5 s, and so must
//                      every later call (isend, listen+connect)
//   bench              one connection pair in this process, as the proxy thread drives it: a
//                      line "bench <mode> 64MiB <GB/s> GB/s 8B <us> us" (mode: daemon when
//                      GW_DAEMON is set, else direct)
//   bench-xhost        the same with the two ends on two hosts of GW_PLUGIN_TEST_XHOST: the
//                      receiver here (host b), the sender in a second instance of the plugin on
//                      host a through daemon a (mode daemon-xhost)
#pragma once

namespace gw::plugin_test {

// The scenario's exit status; -1 when argv names none of these.
int run_daemon_scenario(int argc, char** argv);

}  // namespace gw::plugin_test
