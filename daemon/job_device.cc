// Trainers' device buffers in a job (docs/daemon.md, "Device buffers"): the imports and releases
// each trainer sends, and the host path that runs a collective on imported device buffers: every
// device range is copied to host memory (cuMemcpyDtoH), the collective runs as on arenas (the
// local sum on the CPU, the inter-host leg from that host memory), and every device receive range
// is written back (cuMemcpyHtoD). No reduction kernel runs in the daemon yet; the stand-in driver
// of the tests could not run one anyway.
#include <algorithm>
#include <utility>
#include <vector>

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

// One copy between an import and host memory.
struct Copy {
  const DeviceImport* imp;
  uint64_t off;
  uint8_t* host;
  size_t bytes;
};

// Runs the copies on the server's pool, each cut into pieces of kCopyPiece, so that the trainers'
// copies overlap one another (and a large one its own pieces); the first error is returned.
constexpr size_t kCopyPiece = 4u << 20;
Status run_copies(ReducePool* pool, const std::vector<Copy>& copies, bool to_device) {
  std::vector<Copy> pieces;
  for (const Copy& c : copies) {
    for (size_t at = 0; at < c.bytes; at += kCopyPiece) {
      pieces.push_back({c.imp, c.off + at, c.host + at, std::min(kCopyPiece, c.bytes - at)});
    }
  }
  std::vector<Status> result(pieces.size());
  auto one = [&](size_t k) {
    const Copy& c = pieces[k];
    result[k] =
        to_device ? c.imp->upload(c.off, c.host, c.bytes) : c.imp->download(c.off, c.host, c.bytes);
  };
  if (pool != nullptr && pieces.size() > 1) {
    pool->run(pieces.size(), one);
  } else {
    for (size_t k = 0; k < pieces.size(); ++k) one(k);
  }
  for (const Status& r : result) GW_RETURN_IF_ERROR(r);
  return ok_status();
}

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
  std::vector<Copy> copies;
  for (size_t i = 0; i < members.size(); ++i) {
    const Request& r = reqs[i];
    DeviceStage& st = stage[i];
    st.shared = r.send_alloc != 0 && r.send_alloc == r.recv_alloc && r.send_off == r.recv_off &&
                r.send_bytes == r.recv_bytes;
    if (r.send_alloc != 0) {
      GW_ASSIGN_OR_RETURN(const DeviceImport* imp, import_of(*members[i], r.send_alloc));
      st.in.resize(r.send_bytes);
      copies.push_back({imp, r.send_off, st.in.data(), r.send_bytes});
    }
    if (r.recv_alloc != 0 && !st.shared) {
      // Read too: what the collective does not write (a strided gather's gaps) goes back as it was.
      GW_ASSIGN_OR_RETURN(const DeviceImport* imp, import_of(*members[i], r.recv_alloc));
      st.out.resize(r.recv_bytes);
      copies.push_back({imp, r.recv_off, st.out.data(), r.recv_bytes});
    }
  }
  return run_copies(pool, copies, false);
}

Status Job::stage_out(const std::vector<Request>& reqs) {
  std::vector<Copy> copies;
  for (size_t i = 0; i < members.size(); ++i) {
    const Request& r = reqs[i];
    if (r.recv_alloc == 0) continue;
    GW_ASSIGN_OR_RETURN(const DeviceImport* imp, import_of(*members[i], r.recv_alloc));
    copies.push_back({imp, r.recv_off, dst_of(i, r), r.recv_bytes});
  }
  return run_copies(pool, copies, true);
}

}  // namespace gw::daemon
