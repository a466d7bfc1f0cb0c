// Loader side of dpdk/port_module.h.
#include "dpdk/port_module.h"

#include <dlfcn.h>
#include <sys/stat.h>

#include <cstdlib>
#include <mutex>

#include "core/config.h"
#include "core/log.h"
#include "dpdk/dpdk_config.h"

#ifndef GW_DPDK_MODULE_BUILD_DIR
#define GW_DPDK_MODULE_BUILD_DIR ""
#endif
#ifndef GW_DPDK_MODULE_INSTALL_DIR
#define GW_DPDK_MODULE_INSTALL_DIR ""
#endif
#ifndef GW_DPDK_MODULE_LIBDIR_NAME
#define GW_DPDK_MODULE_LIBDIR_NAME "lib"
#endif

namespace gw::dpdk {

namespace {

bool is_file(const std::string& path) {
  struct stat st {};
  return !path.empty() && ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::string dir_of(const std::string& path) {
  size_t slash = path.rfind('/');
  return slash == std::string::npos ? std::string(".") : path.substr(0, slash);
}

// The directory of the library or program this code was linked into.
std::string own_dir() {
  Dl_info info{};
  static int anchor;
  if (dladdr(&anchor, &info) == 0 || info.dli_fname == nullptr) return "";
  std::string file = info.dli_fname;
  // The main program may report its argv[0], possibly relative: ask the kernel instead.
  if (file.empty() || file[0] != '/') {
    char buf[4096];
    ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
    if (n <= 0) return "";
    file.assign(buf, static_cast<size_t>(n));
  }
  return dir_of(file);
}

struct Loaded {
  std::once_flag once;
  Status status;
  const PortModuleV1* module = nullptr;
  std::string path;
};

Loaded& loaded() {
  static Loaded l;
  return l;
}

Status load(Loaded& l) {
  GW_ASSIGN_OR_RETURN(std::string path, find_port_module());
  // RTLD_LOCAL: the module's DPDK symbols stay out of the process's global namespace.
  void* h = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (h == nullptr) {
    const char* e = ::dlerror();
    return unsupported(
        "dpdk: cannot load the DPDK module {}: {} (is DPDK installed? Debian: "
        "apt-get install dpdk)",
        path, e != nullptr ? e : "unknown error");
  }
  auto entry = reinterpret_cast<PortModuleEntry>(::dlsym(h, kPortModuleSymbol));
  const PortModuleV1* m = entry != nullptr ? entry() : nullptr;
  if (m == nullptr) {
    ::dlclose(h);
    return unsupported("dpdk: {} is not a gradwire DPDK module (no {})", path, kPortModuleSymbol);
  }
  if (m->size != sizeof(PortModuleV1) || std::string(m->build_id) != build_id()) {
    std::string other = m->size == sizeof(PortModuleV1) ? m->build_id : "another layout";
    ::dlclose(h);
    return unsupported(
        "dpdk: {} comes from another build of gradwire ({}) than this one ({}): install the "
        "module of this build beside the library, or point GW_DPDK_MODULE at it",
        path, other, build_id());
  }
  m->adopt_logger(log::shared());
  l.module = m;
  l.path = path;
  GW_LOG_INFO("dpdk: port module {}", path);
  return ok_status();  // the handle stays open for the life of the process (EAL cannot stop)
}

}  // namespace

std::vector<std::string> port_module_candidates() {
  std::vector<std::string> out;
  std::string env = config::get_string(dpdk_config::kDpdkModule);
  if (!env.empty()) return {env};  // asked for one file: only that one
  const std::string file = kPortModuleFile;
  std::string mine = own_dir();
  if (!mine.empty()) out.push_back(mine + "/" + file);
  if (*GW_DPDK_MODULE_BUILD_DIR != '\0')
    out.push_back(std::string(GW_DPDK_MODULE_BUILD_DIR) + "/" + file);
  if (!mine.empty()) out.push_back(dir_of(mine) + "/" + GW_DPDK_MODULE_LIBDIR_NAME + "/" + file);
  if (*GW_DPDK_MODULE_INSTALL_DIR != '\0') {
    out.push_back(std::string(GW_DPDK_MODULE_INSTALL_DIR) + "/" + file);
  }
  return out;
}

Result<std::string> find_port_module() {
  std::vector<std::string> candidates = port_module_candidates();
  for (const std::string& c : candidates) {
    if (is_file(c)) return c;
  }
  if (!config::get_string(dpdk_config::kDpdkModule).empty()) {
    return unsupported("dpdk: GW_DPDK_MODULE={}: no such file", candidates.front());
  }
  std::string looked;
  for (const std::string& c : candidates) looked += (looked.empty() ? "" : ", ") + c;
  return unsupported(
      "dpdk: the DPDK module {} is not installed (looked for {}): this "
      "gradwire runs without DPDK; set GW_DPDK_MODULE to its file if it lies elsewhere",
      kPortModuleFile, looked);
}

Result<std::unique_ptr<FramePort>> open_port_through_module(const DpdkPortOptions& options) {
  Loaded& l = loaded();
  std::call_once(l.once, [&] { l.status = load(l); });
  if (!l.status.ok()) return l.status;
  char err[1024] = {0};
  int code = static_cast<int>(Code::kUnsupported);
  FramePort* port = l.module->open_port(&options, &code, err, sizeof(err));
  if (port == nullptr) {
    if (code == static_cast<int>(Code::kOk)) code = static_cast<int>(Code::kInternal);
    return Status(static_cast<Code>(code),
                  err[0] != '\0' ? err : "dpdk: the module could not open the port");
  }
  return std::unique_ptr<FramePort>(port);
}

std::string loaded_port_module() {
  Loaded& l = loaded();
  return l.module != nullptr ? l.path : std::string();
}

}  // namespace gw::dpdk
