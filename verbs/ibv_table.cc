#include "verbs/ibv_table.h"

#include <dlfcn.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <mutex>

#include "core/config.h"
#include "verbs/emu/emu_verbs.h"
#include "verbs/verbs_config.h"

namespace gw::verbs {
namespace {

// The provider's data path lives in context->ops (inline functions in verbs.h); calling it from
// these out-of-line entries keeps one path for the library and the emulator.
int lib_post_send(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad) {
  return qp->context->ops.post_send(qp, wr, bad);
}
int lib_post_recv(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad) {
  return qp->context->ops.post_recv(qp, wr, bad);
}
int lib_poll_cq(ibv_cq* cq, int num, ibv_wc* wc) { return cq->context->ops.poll_cq(cq, num, wc); }

int (*lib_query_port_compat)(ibv_context*, uint8_t, ibv_port_attr*) = nullptr;

int lib_query_port(ibv_context* context, uint8_t port, ibv_port_attr* attr) {
  std::memset(attr, 0, sizeof(*attr));
  return lib_query_port_compat(context, port, attr);
}

const char* (*lib_get_device_name_fn)(ibv_device*) = nullptr;

int lib_query_gid_type(ibv_context* context, uint8_t port, int index, char* out, size_t len) {
  // A test knob of the process-wide library table, not of one transport: read when asked.
  std::string type;
  int err = read_sysfs_gid_type(config::get_string(verbs_config::kIbSysfsRoot),
                                lib_get_device_name_fn(context->device), port, index, &type);
  if (err != 0) return err;
  std::snprintf(out, len, "%s", type.c_str());
  return 0;
}

template <typename F>
bool load(void* lib, F** out, const char* name, const char* version) {
  *out = reinterpret_cast<F*>(dlvsym(lib, name, version));
  return *out != nullptr;
}

struct Loaded {
  IbvTable table;
  Status status;
};

Loaded load_library() {
  Loaded l;
  void* lib = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* why = dlerror();
    l.status = unsupported(
        "libibverbs.so.1 not found ({}); install "
        "rdma-core's libibverbs1, or set GW_VERBS_EMULATE=1 for the emulator",
        why != nullptr ? why : "dlopen failed");
    return l;
  }
  IbvTable& t = l.table;
  t.provider = "libibverbs.so.1";
  const char* missing = nullptr;
  auto need = [&](auto** out, const char* name) {
    if (missing == nullptr && !load(lib, out, name, "IBVERBS_1.1")) missing = name;
  };
  need(&t.get_device_list, "ibv_get_device_list");
  need(&t.free_device_list, "ibv_free_device_list");
  need(&lib_get_device_name_fn, "ibv_get_device_name");
  t.get_device_name = lib_get_device_name_fn;
  need(&t.open_device, "ibv_open_device");
  need(&t.close_device, "ibv_close_device");
  need(&t.query_device, "ibv_query_device");
  need(&lib_query_port_compat, "ibv_query_port");
  t.query_port = &lib_query_port;
  need(&t.query_gid, "ibv_query_gid");
  t.query_gid_type = &lib_query_gid_type;
  need(&t.alloc_pd, "ibv_alloc_pd");
  need(&t.dealloc_pd, "ibv_dealloc_pd");
  need(&t.reg_mr, "ibv_reg_mr");
  need(&t.dereg_mr, "ibv_dereg_mr");
  need(&t.create_cq, "ibv_create_cq");
  need(&t.destroy_cq, "ibv_destroy_cq");
  need(&t.create_qp, "ibv_create_qp");
  need(&t.modify_qp, "ibv_modify_qp");
  need(&t.destroy_qp, "ibv_destroy_qp");
  need(&t.get_async_event, "ibv_get_async_event");
  need(&t.ack_async_event, "ibv_ack_async_event");
  need(&t.fork_init, "ibv_fork_init");
  if (missing != nullptr) {
    l.status = unsupported("libibverbs.so.1 lacks {}@IBVERBS_1.1", missing);
    return l;
  }
  (void)load(lib, &t.reg_dmabuf_mr, "ibv_reg_dmabuf_mr", "IBVERBS_1.12");  // optional
  t.post_send = &lib_post_send;
  t.post_recv = &lib_post_recv;
  t.poll_cq = &lib_poll_cq;
  return l;  // the library stays loaded for the life of the process
}

const Loaded& library() {
  static const Loaded* loaded = new Loaded(load_library());
  return *loaded;
}

}  // namespace

Result<const IbvTable*> ibv_library_table() {
  const Loaded& l = library();
  if (!l.status.ok()) return l.status;
  return &l.table;
}

Result<const IbvTable*> ibv_table(bool emulate) {
  if (emulate) return emu::emu_table();
  return ibv_library_table();
}

Status rdma_devices_present(const IbvTable& ibv) {
  int num = 0;
  errno = 0;
  ibv_device** list = ibv.get_device_list(&num);
  const int err = errno;
  if (list != nullptr) ibv.free_device_list(list);
  if (list != nullptr && num > 0) return ok_status();
  return unsupported("no RDMA devices ({}{})",
                     err == ENOSYS ? "the kernel has no RDMA support: " : "",
                     err != 0 ? strerror(err) : "the device list is empty");
}

int read_sysfs_gid_type(const std::string& sysfs_root, const std::string& device, int port,
                        int index, std::string* type) {
  std::string path = sysfs_root + "/class/infiniband/" + device + "/ports/" + std::to_string(port) +
                     "/gid_attrs/types/" + std::to_string(index);
  FILE* f = std::fopen(path.c_str(), "re");
  if (f == nullptr) return errno;
  char buf[64] = {};
  errno = 0;
  size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
  int err = std::ferror(f) ? (errno != 0 ? errno : EIO) : 0;
  std::fclose(f);
  if (err != 0) return err;
  std::string s(buf, n);
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  *type = s;
  return 0;
}

std::string wc_status_name(int status) {
  static const char* const kNames[] = {
      "SUCCESS",          "LOC_LEN_ERR",       "LOC_QP_OP_ERR",     "LOC_EEC_OP_ERR",
      "LOC_PROT_ERR",     "WR_FLUSH_ERR",      "MW_BIND_ERR",       "BAD_RESP_ERR",
      "LOC_ACCESS_ERR",   "REM_INV_REQ_ERR",   "REM_ACCESS_ERR",    "REM_OP_ERR",
      "RETRY_EXC_ERR",    "RNR_RETRY_EXC_ERR", "LOC_RDD_VIOL_ERR",  "REM_INV_RD_REQ_ERR",
      "REM_ABORT_ERR",    "INV_EECN_ERR",      "INV_EEC_STATE_ERR", "FATAL_ERR",
      "RESP_TIMEOUT_ERR", "GENERAL_ERR"};
  const char* name =
      status >= 0 && status < static_cast<int>(std::size(kNames)) ? kNames[status] : "UNKNOWN";
  return fmt::format("IBV_WC_{} ({})", name, status);
}

}  // namespace gw::verbs
