// Daemon mode's CUDA device buffers (DaemonSession, capi/daemon_session.h; docs/daemon.md,
// "Device buffers"). Each device allocation a collective names is exported to gradwired once, by
// its CUDA IPC handle (cuIpcGetMemHandle on the allocation's base, found with
// cuMemGetAddressRange), in an import submission (docs/wire-daemon.md); later submissions name
// (allocation id, offset) and the daemon reads and writes the trainer's device memory itself. An
// allocation freed and another made at its address has another buffer id
// (CU_POINTER_ATTRIBUTE_BUFFER_ID): its import is released and the new one exported. Memory that
// cannot be exported (virtual-memory allocations such as PyTorch's expandable segments, a driver
// without IPC, a daemon that cannot open it) and a collective mixing device and host buffers are
// staged: copied to host memory here, run as host buffers (the arena), copied back.
#include <cstring>
#include <vector>

#include "capi/daemon_session.h"
#include "capi/daemon_session_trace.h"
#include "capi/device_memory.h"
#include "collectives/call.h"
#include "core/log.h"
#include "gpudirect/cuda_driver.h"

namespace gw::capi {

using daemon::Opcode;

std::shared_ptr<DeviceMemory> DaemonSession::device_memory() const {
  std::call_once(device_memory_once_,
                 [&] { device_memory_ = std::make_shared<DeviceMemory>(rank_, "daemon"); });
  return device_memory_;
}

Status DaemonSession::device_collective(const coll::CollectiveCall& c) {
  using coll::CallKind;
  const bool reduces = c.kind == CallKind::kAllreduce || c.kind == CallKind::kReduceScatter;
  CallSpan span(coll::call_name(c.kind), call_bytes(c, size_), c.dtype, reduces ? &c.op : nullptr);
  in_order();  // after the i-forms queued before it (capi/daemon_calls.cc)
  switch (c.kind) {
    case CallKind::kAllreduce:
      return device_call(Opcode::kAllreduce, c.sendbuf, c.recvbuf, c.count, c.dtype, c.op, 0);
    case CallKind::kBroadcast:
      return device_call(Opcode::kBroadcast, c.recvbuf, c.recvbuf, c.count, c.dtype, c.op, c.root);
    case CallKind::kAllgather:
      return device_call(Opcode::kAllgather, c.sendbuf, c.recvbuf, c.count, c.dtype, c.op, 0);
    case CallKind::kReduceScatter:
      return device_call(Opcode::kReduceScatter, c.sendbuf, c.recvbuf, c.count, c.dtype, c.op, 0);
    case CallKind::kAlltoall:
      return device_call(Opcode::kAlltoall, c.sendbuf, c.recvbuf, c.count, c.dtype, c.op, 0);
    default:
      return internal_error("daemon mode: no device path of its own for this call");
  }
}

bool DaemonSession::is_device(const void* p) {
  return p != nullptr && cuda::resident_memory_kind(p) == cuda::MemoryKind::kDevice;
}

Status DaemonSession::release_import(uint32_t id) {
  daemon::SqEntry e{};
  e.opcode = static_cast<uint16_t>(Opcode::kRelease);
  e.spec_len = id;
  return client_->submit(e, "release of a device allocation");
}

Result<DaemonSession::DevRef> DaemonSession::device_ref(const void* p) {
  const cuda::Driver* d = cuda::resident_driver();
  if (d == nullptr || d->cuMemGetAddressRange == nullptr) return DevRef{};
  const auto ptr = reinterpret_cast<cuda::CUdeviceptr>(p);
  cuda::CUdeviceptr base = 0;
  size_t bytes = 0;
  if (d->cuMemGetAddressRange(&base, &bytes, ptr) != cuda::kCudaSuccess || bytes == 0) {
    return DevRef{};
  }
  uint64_t buffer_id = 0;
  (void)d->cuPointerGetAttribute(&buffer_id, cuda::kPointerAttrBufferId, ptr);
  // Imports of memory since freed: an entry over this range that is not this allocation.
  for (auto it = dev_allocs_.begin(); it != dev_allocs_.end();) {
    const bool overlaps = it->first < base + bytes && base < it->first + it->second.bytes;
    const bool same =
        it->first == base && it->second.bytes == bytes && it->second.buffer_id == buffer_id;
    if (same) return DevRef{it->second.id, ptr - base};
    if (overlaps) {
      if (it->second.id != 0) GW_RETURN_IF_ERROR(release_import(it->second.id));
      it = dev_allocs_.erase(it);
    } else {
      ++it;
    }
  }
  DeviceAlloc a;
  a.bytes = bytes;
  a.buffer_id = buffer_id;
  std::string why;
  daemon::ImportWire w{};
  if (d->cuIpcGetMemHandle == nullptr) {
    why = "the CUDA driver has no CUDA IPC";
  } else if (cuda::CUresult r = d->cuIpcGetMemHandle(w.handle, base); r != cuda::kCudaSuccess) {
    why = "cuIpcGetMemHandle: " + cuda::error_text(*d, r) +
          " (a virtual-memory allocation, such as PyTorch's expandable segments?)";
  } else if (next_alloc_id_ > 0x7fffffffu || dev_allocs_.size() >= daemon::kMaxImportsPerClient) {
    why = "too many device allocations imported";
  } else {
    int device = 0;
    (void)d->cuPointerGetAttribute(&device, cuda::kPointerAttrDeviceOrdinal, ptr);
    w.kind = daemon::kImportCudaIpc;
    w.alloc_id = next_alloc_id_++;
    w.bytes = bytes;
    w.device = device;
    GW_ASSIGN_OR_RETURN(Placed rec, client_->place(&w, sizeof(w), true));
    daemon::SqEntry e{};
    e.opcode = static_cast<uint16_t>(Opcode::kImport);
    e.meta_off = rec.off;
    e.spec_len = sizeof(w);
    Status s = client_->submit(e, "import of a device allocation");
    client_->unplace(rec);
    if (s.ok()) {
      a.id = w.alloc_id;
    } else if (s.code() == Code::kPeer || s.code() == Code::kAborted ||
               s.code() == Code::kTimeout) {
      return s;  // the connection or the job is gone
    } else {
      why = s.message();
    }
  }
  if (a.id != 0 && !said_imported_) {
    said_imported_ = true;
    GW_LOG_INFO(
        "daemon mode: device buffers go to gradwired by CUDA IPC (allocation of {} bytes on device "
        "{} imported); this trainer copies nothing",
        bytes, w.device);
  }
  if (a.id == 0 && !said_staged_) {
    said_staged_ = true;
    GW_LOG_INFO("daemon mode: a device allocation of {} bytes is staged through host memory: {}",
                bytes, why);
  }
  dev_allocs_[base] = a;
  return DevRef{a.id, ptr - base};
}

namespace {

// Host copies of a collective's device buffers: one buffer where one range holds the other (in
// place), two otherwise; host buffers are used as they are.
struct Staging {
  std::vector<uint8_t> a, b;
  const void* send = nullptr;
  void* recv = nullptr;
};

Status copy(const cuda::Driver& d, void* dst, const void* src, size_t n, bool to_device) {
  if (n == 0) return ok_status();
  PhaseSpan staging(to_device ? "stage to device" : "stage from device", n);
  const cuda::CUresult r = to_device
                               ? d.cuMemcpyHtoD(reinterpret_cast<cuda::CUdeviceptr>(dst), src, n)
                               : d.cuMemcpyDtoH(dst, reinterpret_cast<cuda::CUdeviceptr>(src), n);
  if (r != cuda::kCudaSuccess) {
    return cuda::cuda_error(d, r,
                            to_device ? "daemon mode: staging back to device memory"
                                      : "daemon mode: staging device memory");
  }
  return ok_status();
}

}  // namespace

Status DaemonSession::device_call(Opcode opcode, const void* sendbuf, void* recvbuf, size_t count,
                                  coll::DataType dtype, coll::ReduceOp op, int root) {
  const size_t block = count * coll::dtype_size(dtype);
  const size_t all = block * static_cast<size_t>(size_);
  const size_t send_bytes =
      opcode == Opcode::kReduceScatter || opcode == Opcode::kAlltoall ? all : block;
  const size_t recv_bytes =
      opcode == Opcode::kAllgather || opcode == Opcode::kAlltoall ? all : block;
  const char* what = daemon::opcode_name(opcode);
  const bool send_dev = is_device(sendbuf), recv_dev = is_device(recvbuf);
  if (count > 0 && send_dev && recv_dev) {
    std::lock_guard<std::mutex> lock(mu_);
    GW_ASSIGN_OR_RETURN(DevRef s, device_ref(sendbuf));
    GW_ASSIGN_OR_RETURN(DevRef r, sendbuf == recvbuf ? Result<DevRef>(s) : device_ref(recvbuf));
    if (s.id != 0 && r.id != 0) {
      daemon::SqEntry e{};
      e.opcode = static_cast<uint16_t>(opcode);
      e.dtype = static_cast<uint8_t>(dtype);
      if (opcode == Opcode::kAllreduce || opcode == Opcode::kReduceScatter) {
        e.op = static_cast<uint8_t>(op);
      }
      if (opcode == Opcode::kBroadcast) e.root = root;
      e.count = count;
      e.send_off = s.off;
      e.recv_off = r.off;
      e.spec_len = s.id;
      e.key_len = r.id;
      return client_->submit(e, what);
    }
  }
  // Staged: host copies of the device buffers, the host path, the result copied back.
  const cuda::Driver* d = cuda::resident_driver();
  if (d == nullptr) return internal_error("daemon mode: device memory without a CUDA driver");
  const auto* sb = static_cast<const uint8_t*>(sendbuf);
  auto* rb = static_cast<uint8_t*>(recvbuf);
  Staging st;
  if (send_dev && recv_dev && sb >= rb && sb + send_bytes <= rb + recv_bytes) {
    st.a.resize(recv_bytes);  // sendbuf inside recvbuf (in place)
    GW_RETURN_IF_ERROR(copy(*d, st.a.data(), rb, recv_bytes, false));
    st.recv = st.a.data();
    st.send = st.a.data() + (sb - rb);
  } else if (send_dev && recv_dev && rb >= sb && rb + recv_bytes <= sb + send_bytes) {
    st.a.resize(send_bytes);  // recvbuf inside sendbuf (reduce_scatter in place)
    GW_RETURN_IF_ERROR(copy(*d, st.a.data(), sb, send_bytes, false));
    st.send = st.a.data();
    st.recv = st.a.data() + (rb - sb);
  } else {
    st.send = sendbuf;
    st.recv = recvbuf;
    if (send_dev) {
      st.a.resize(send_bytes);
      GW_RETURN_IF_ERROR(copy(*d, st.a.data(), sb, send_bytes, false));
      st.send = st.a.data();
    }
    if (recv_dev) {
      st.b.resize(recv_bytes);
      GW_RETURN_IF_ERROR(copy(*d, st.b.data(), rb, recv_bytes, false));
      st.recv = st.b.data();
    }
  }
  Status s;
  switch (opcode) {
    case Opcode::kAllreduce:
      s = allreduce(st.send, st.recv, count, dtype, op);
      break;
    case Opcode::kBroadcast:
      s = broadcast(st.recv, count, dtype, root);
      break;
    case Opcode::kAllgather:
      s = allgather(st.send, st.recv, count, dtype);
      break;
    case Opcode::kReduceScatter:
      s = reduce_scatter(st.send, st.recv, count, dtype, op);
      break;
    case Opcode::kAlltoall:
      s = alltoall(st.send, st.recv, count, dtype);
      break;
    default:
      return internal_error("daemon mode: {} on device buffers", what);
  }
  GW_RETURN_IF_ERROR(s);
  if (recv_dev) GW_RETURN_IF_ERROR(copy(*d, recvbuf, st.recv, recv_bytes, true));
  return ok_status();
}

}  // namespace gw::capi
