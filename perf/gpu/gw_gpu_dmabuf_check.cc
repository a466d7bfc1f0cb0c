// gw-gpu-dmabuf-check: on a GPU host, that a verbs registration of real CUDA memory
// (reg_mr(..., MemType::kCuda)) exports a dma-buf with the CUDA driver and hands it to
// ibv_reg_dmabuf_mr. The NIC is the verbs emulator (GW_VERBS_EMULATE=1), which records each
// dma-buf registration (fd target, offset, length, iova, access); no bytes move, since the
// emulator cannot reach GPU memory. Exit 0 when every check held, 1 otherwise, 3 without a GPU.
// Built by perf/gpu/CMakeLists.txt (standalone) and run by perf/gpu/run_gpu_check.sh --dmabuf.
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "core/net/transport.h"
#include "gpudirect/cuda_driver.h"
#include "verbs/emu/emu_verbs.h"
#include "verbs/verbs_transport.h"

namespace {

int failures = 0;

void check(bool ok, const std::string& what) {
  std::printf("%s %s\n", ok ? "ok  " : "FAIL", what.c_str());
  if (!ok) ++failures;
}

}  // namespace

int main() {
  using namespace gw;
  setenv("GW_VERBS_EMULATE", "1", 1);
  auto drv = cuda::driver();
  if (!drv.ok()) {
    std::printf("no GPU: %s\n", drv.status().to_string().c_str());
    return 3;
  }
  const cuda::Driver& d = **drv;
  std::printf("CUDA driver %d (%s); cuMemGetHandleForAddressRange %s\n", d.version,
              d.library.c_str(), d.cuMemGetHandleForAddressRange ? "present" : "absent");
  cuda::CUdevice dev = 0;
  cuda::CUcontext ctx = nullptr;
  if (d.cuDeviceGet(&dev, 0) != cuda::kCudaSuccess ||
      d.cuDevicePrimaryCtxRetain(&ctx, dev) != cuda::kCudaSuccess ||
      d.cuCtxSetCurrent(ctx) != cuda::kCudaSuccess) {
    std::printf("cannot make a context on device 0\n");
    return 1;
  }
  int dmabuf_attr = -1;
  d.cuDeviceGetAttribute(&dmabuf_attr, 124, dev);  // CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED
  std::printf("CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED = %d\n", dmabuf_attr);
  constexpr size_t kAlloc = size_t{8} << 20;
  cuda::CUdeviceptr buf = 0;
  if (d.cuMemAlloc(&buf, kAlloc) != cuda::kCudaSuccess) {
    std::printf("cuMemAlloc failed\n");
    return 1;
  }

  net::TransportOptions o;
  o.job_token = "dmabuf-check";
  auto t = verbs::make_verbs_transport(o);
  if (!t.ok()) {
    std::printf("verbs over the emulator: %s\n", t.status().to_string().c_str());
    return 1;
  }
  const net::Transport::DeviceMemory dm = (*t)->device_memory();
  check(dm.reg && dm.dmabuf, "the transport offers dma-buf registration (" + dm.why + ")");

  net::Handle h;
  auto l = (*t)->listen(&h);
  auto c = (*t)->connect(h);
  if (!l.ok() || !c.ok()) {
    std::printf("listen/connect failed\n");
    return 1;
  }
  std::unique_ptr<net::SendComm> send;
  std::unique_ptr<net::RecvComm> recv;
  for (int i = 0; i < 100000 && (!send || !recv); ++i) {
    if (!send) send = std::move(*(*c)->poll());
    if (!recv) recv = std::move(*(*l)->accept());
    usleep(100);
  }
  if (!send || !recv) {
    std::printf("no connection\n");
    return 1;
  }
  const size_t before = verbs::emu::dmabuf_records().size();
  // A range that starts one page and 100 bytes into the allocation.
  void* p = reinterpret_cast<void*>(buf + 4096 + 100);
  const size_t len = size_t{1} << 20;
  auto mr = send->reg_mr(p, len, net::MemType::kCuda);
  check(mr.ok(), "reg_mr(kCuda) of real device memory: " +
                     (mr.ok() ? std::string("registered") : mr.status().to_string()));
  auto recs = verbs::emu::dmabuf_records();
  check(recs.size() == before + 1, "one ibv_reg_dmabuf_mr call recorded");
  if (recs.size() == before + 1) {
    const verbs::emu::DmabufRecord& r = recs.back();
    std::printf("record: fd %d -> '%s', offset %llu, length %zu, iova %#llx, access %#x\n", r.fd,
                r.target.c_str(), static_cast<unsigned long long>(r.offset), r.length,
                static_cast<unsigned long long>(r.iova), r.access);
    check(r.target.find("dmabuf") != std::string::npos,
          "the fd was the driver's dma-buf export (" + r.target + ")");
    check(r.offset == 4096 && r.iova == buf + 4096,
          "registered from the range's page, at its offset into the allocation");
    check(r.iova + r.length >= buf + 4096 + 100 + len, "the registration covers the range");
    // Remote read too: the GDR flush reads a byte of received device memory back.
    check(r.access == (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ),
          "access flags");
    check(fcntl(r.fd, F_GETFD) == -1, "the exported fd was closed after registration");
  }
  if (mr.ok()) check(send->dereg_mr(*mr).ok(), "dereg_mr");
  // Host memory must never take the dma-buf path.
  std::string host(4096, 'x');
  auto hmr = send->reg_mr(host.data(), host.size(), net::MemType::kHost);
  check(hmr.ok() && verbs::emu::dmabuf_records().size() == before + 1,
        "host memory registers without dma-buf");
  send.reset();
  recv.reset();
  d.cuMemFree(buf);
  std::printf("%s\n", failures == 0 ? "PASS" : "FAIL");
  return failures == 0 ? 0 : 1;
}
