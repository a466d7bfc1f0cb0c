// Trainers' device buffers in a job (docs/daemon.md, "Device buffers"): the imports and releases
// each trainer sends, and the host path that runs a collective on imported device buffers: every
// device range is copied to host memory (cuMemcpyDtoH), the collective runs as on arenas (the
// local sum on the CPU, the inter-host leg from that host memory), and every device receive range
// is written back (cuMemcpyHtoD). No reduction kernel runs in the daemon yet; the stand-in driver
// of the tests could not run one anyway.
#include <utility>

#include "core/log.h"
#include "daemon/job.h"

namespace gw::daemon {

void Job::settle(Trainer& t) {
  while (failure.ok() && !t.pending.empty()) {
    const Request& r = t.pending.front();
    if (r.opcode != Opcode::kImport && r.opcode != Opcode::kRelease) return;
    Status s;
    if (r.opcode == Opcode::kImport) {
      auto imp = DeviceImport::open(r, &counters->live_imports, imports);
      if (imp.ok()) {
        t.imports[r.alloc_id] = std::move(*imp);
        GW_LOG_DEBUG("gradwired: {} imported allocation {} ({} bytes on device {})", t.name(),
                     r.alloc_id, r.alloc_bytes, r.device);
      } else {
        // The trainer stages that allocation through its arena instead (it says so).
        s = imp.status();
        t.alloc_sizes.erase(r.alloc_id);
        GW_LOG_INFO("gradwired: {} could not be given allocation {}: {}", t.name(), r.alloc_id,
                    s.message());
      }
    } else {
      t.imports.erase(r.alloc_id);
    }
    complete(t, r.seq, s);
    t.pending.pop_front();
  }
}

Status Job::execute(const std::vector<Request>& reqs) {
  bool device = false;
  for (const Request& r : reqs) device = device || r.send_alloc != 0 || r.recv_alloc != 0;
  if (!device) return execute_host(reqs);
  if (!said_device_path) {
    said_device_path = true;
    GW_LOG_INFO(
        "gradwired: job of {} ranks (host {} of {}): device buffers imported over CUDA IPC, "
        "summed on the host path (device -> host, sum, host -> device)",
        first.world_size, first.host_index, first.num_hosts);
  }
  GW_RETURN_IF_ERROR(stage_in(reqs));
  GW_RETURN_IF_ERROR(execute_host(reqs));
  return stage_out(reqs);
}

namespace {

Result<const DeviceImport*> import_of(const Trainer& t, uint32_t id) {
  auto it = t.imports.find(id);
  if (it == t.imports.end()) {
    return invalid_arg("{} names allocation {}, which is not open (its import failed)", t.name(),
                       id);
  }
  return it->second.get();
}

}  // namespace

Status Job::stage_in(const std::vector<Request>& reqs) {
  stage.resize(members.size());
  for (size_t i = 0; i < members.size(); ++i) {
    const Request& r = reqs[i];
    DeviceStage& st = stage[i];
    st.shared = r.send_alloc != 0 && r.send_alloc == r.recv_alloc && r.send_off == r.recv_off &&
                r.send_bytes == r.recv_bytes;
    if (r.send_alloc != 0) {
      GW_ASSIGN_OR_RETURN(const DeviceImport* imp, import_of(*members[i], r.send_alloc));
      st.in.resize(r.send_bytes);
      GW_RETURN_IF_ERROR(imp->download(r.send_off, st.in.data(), r.send_bytes));
    }
    if (r.recv_alloc != 0 && !st.shared) {
      // Read too: what the collective does not write (a strided gather's gaps) goes back as it was.
      GW_ASSIGN_OR_RETURN(const DeviceImport* imp, import_of(*members[i], r.recv_alloc));
      st.out.resize(r.recv_bytes);
      GW_RETURN_IF_ERROR(imp->download(r.recv_off, st.out.data(), r.recv_bytes));
    }
  }
  return ok_status();
}

Status Job::stage_out(const std::vector<Request>& reqs) {
  for (size_t i = 0; i < members.size(); ++i) {
    const Request& r = reqs[i];
    if (r.recv_alloc == 0) continue;
    GW_ASSIGN_OR_RETURN(const DeviceImport* imp, import_of(*members[i], r.recv_alloc));
    GW_RETURN_IF_ERROR(imp->upload(r.recv_off, dst_of(i, r), r.recv_bytes));
  }
  return ok_status();
}

}  // namespace gw::daemon
