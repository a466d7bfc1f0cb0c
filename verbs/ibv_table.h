// The one table of libibverbs entry points the verbs backend calls.
//
// Every call the backend makes into verbs goes through this table, the data path included
// (post_send, post_recv, poll_cq are the provider's inline context->ops in verbs.h; here they are
// table entries), so a table from the emulator (verbs/emu/) sees every post and every poll.
//
// ibv_table() loads libibverbs.so.1 with dlopen and resolves each symbol with dlvsym at its
// IBVERBS_1.x version; reg_dmabuf_mr (IBVERBS_1.12) is optional and null when absent.
// ibv_table(true) (GW_VERBS_EMULATE=1) returns the emulator's table instead. Each table is made
// once per process and is immutable afterwards, so reads need no locking.
#pragma once

#include <infiniband/verbs.h>

#include <cstddef>
#include <string>

#include "core/status.h"

namespace gw::verbs {

struct IbvTable {
  const char* provider = "";  // "libibverbs.so.1" or "emulator"
  bool emulated = false;

  ibv_device** (*get_device_list)(int* num) = nullptr;
  void (*free_device_list)(ibv_device** list) = nullptr;
  const char* (*get_device_name)(ibv_device* device) = nullptr;
  ibv_context* (*open_device)(ibv_device* device) = nullptr;
  int (*close_device)(ibv_context* context) = nullptr;
  int (*query_device)(ibv_context* context, ibv_device_attr* attr) = nullptr;
  // The full ibv_port_attr; the exported symbol fills the older prefix of it (zero the rest).
  int (*query_port)(ibv_context* context, uint8_t port, ibv_port_attr* attr) = nullptr;
  int (*query_gid)(ibv_context* context, uint8_t port, int index, ibv_gid* gid) = nullptr;
  // The GID type text ("RoCE v2", "IB/RoCE v1") of one index; returns 0 or an errno (EINVAL in
  // containers that hide gid_attrs). The library's table reads sysfs.
  int (*query_gid_type)(ibv_context* context, uint8_t port, int index, char* out,
                        size_t len) = nullptr;
  ibv_pd* (*alloc_pd)(ibv_context* context) = nullptr;
  int (*dealloc_pd)(ibv_pd* pd) = nullptr;
  ibv_mr* (*reg_mr)(ibv_pd* pd, void* addr, size_t length, int access) = nullptr;
  // Optional (rdma-core >= 34): null when the library lacks it.
  ibv_mr* (*reg_dmabuf_mr)(ibv_pd* pd, uint64_t offset, size_t length, uint64_t iova, int fd,
                           int access) = nullptr;
  int (*dereg_mr)(ibv_mr* mr) = nullptr;
  ibv_cq* (*create_cq)(ibv_context* context, int cqe, void* cq_context, ibv_comp_channel* channel,
                       int comp_vector) = nullptr;
  int (*destroy_cq)(ibv_cq* cq) = nullptr;
  ibv_qp* (*create_qp)(ibv_pd* pd, ibv_qp_init_attr* attr) = nullptr;
  int (*modify_qp)(ibv_qp* qp, ibv_qp_attr* attr, int mask) = nullptr;
  int (*destroy_qp)(ibv_qp* qp) = nullptr;
  int (*post_send)(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad) = nullptr;
  int (*post_recv)(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad) = nullptr;
  int (*poll_cq)(ibv_cq* cq, int num, ibv_wc* wc) = nullptr;
  int (*get_async_event)(ibv_context* context, ibv_async_event* event) = nullptr;
  void (*ack_async_event)(ibv_async_event* event) = nullptr;
  int (*fork_init)() = nullptr;
};

// The emulator's table when `emulate`, else the library's, or kUnsupported saying why the
// library cannot be used ("libibverbs.so.1 not found (...)").
Result<const IbvTable*> ibv_table(bool emulate);

// The table of the real library regardless of GW_VERBS_EMULATE (for tests of the loader).
Result<const IbvTable*> ibv_library_table();

// Ok when `ibv` lists at least one device, else kUnsupported "no RDMA devices (<why>)".
Status rdma_devices_present(const IbvTable& ibv);

// Reads <sysfs_root>/class/infiniband/<dev>/ports/<port>/gid_attrs/types/<index>; 0 or an errno.
int read_sysfs_gid_type(const std::string& sysfs_root, const std::string& device, int port,
                        int index, std::string* type);

// "IBV_WC_RETRY_EXC_ERR (12: transport retry counter exceeded)"-style text for messages.
std::string wc_status_name(int status);

}  // namespace gw::verbs
