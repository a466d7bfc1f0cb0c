#include "gpudirect/gpu_codecs.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <span>

#include "gpudirect/fatbin.h"

namespace gw::cuda {

namespace {

constexpr unsigned kThreads = 256;  // every kernel's block size (__launch_bounds__ in the .cu)
constexpr size_t kMaxChunk = 1048576;

enum Fn : int {
  kEncF16,
  kEncF16Ef,
  kEncBf16,
  kEncBf16Ef,
  kDecF16Set,
  kDecF16Add,
  kDecBf16Set,
  kDecBf16Add,
  kSignR1,
  kSignR1Ef,
  kSignR2,
  kSignR2Ef,
  kSignR4,
  kSignR4Ef,
  kSignR8,
  kSignR8Ef,
  kSignAny,
  kSignAnyEf,
  kSignDecSet,
  kSignDecAdd,
  kNumFns
};
constexpr std::array<const char*, kNumFns> kFnNames = {
    "gw_cast_encode_f16",      "gw_cast_encode_f16_ef",   "gw_cast_encode_bf16",
    "gw_cast_encode_bf16_ef",  "gw_cast_decode_f16_set",  "gw_cast_decode_f16_add",
    "gw_cast_decode_bf16_set", "gw_cast_decode_bf16_add", "gw_sign_encode_r1",
    "gw_sign_encode_r1_ef",    "gw_sign_encode_r2",       "gw_sign_encode_r2_ef",
    "gw_sign_encode_r4",       "gw_sign_encode_r4_ef",    "gw_sign_encode_r8",
    "gw_sign_encode_r8_ef",    "gw_sign_encode_any",      "gw_sign_encode_any_ef",
    "gw_sign_decode_set",      "gw_sign_decode_add"};

// The kernels loaded on one device (its primary context), kept for the life of the process.
struct DeviceModule {
  CUcontext ctx = nullptr;
  CUmodule mod = nullptr;
  std::array<CUfunction, kNumFns> fn{};
  unsigned sms = 1;
};

// One module per device, loaded on first use. A failed load is not cached (the next call retries
// and reports the same error if it persists).
class ModuleRegistry {
 public:
  static ModuleRegistry& instance() {
    static ModuleRegistry r;
    return r;
  }

  Result<const DeviceModule*> get(const Driver& d, int ordinal) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = loaded_.find(ordinal);
    if (it != loaded_.end()) return static_cast<const DeviceModule*>(it->second.get());
    GW_ASSIGN_OR_RETURN(auto m, load(d, ordinal));
    const DeviceModule* p = m.get();
    loaded_.emplace(ordinal, std::move(m));
    return p;
  }

 private:
  static Result<std::unique_ptr<DeviceModule>> load(const Driver& d, int ordinal) {
    CUdevice dev;
    CUresult r = d.cuDeviceGet(&dev, ordinal);
    if (r != kCudaSuccess) return cuda_error(d, r, fmt::format("cuDeviceGet({})", ordinal));
    auto m = std::make_unique<DeviceModule>();
    r = d.cuDevicePrimaryCtxRetain(&m->ctx, dev);
    if (r != kCudaSuccess) return cuda_error(d, r, "cuDevicePrimaryCtxRetain");
    int sms = 0;
    if (d.cuDeviceGetAttribute(&sms, kAttrMultiprocessorCount, dev) == kCudaSuccess && sms > 0) {
      m->sms = static_cast<unsigned>(sms);
    }
    r = d.cuCtxPushCurrent(m->ctx);
    if (r != kCudaSuccess) {
      d.cuDevicePrimaryCtxRelease(dev);
      return cuda_error(d, r, "cuCtxPushCurrent");
    }
    Status st;
    r = d.cuModuleLoadData(&m->mod, codec_fatbin().data());
    if (r != kCudaSuccess) {
      // No SASS for this GPU and a PTX newer than the driver ends here.
      st = cuda_error(d, r, fmt::format("loading the codec kernels on device {}", ordinal));
    } else {
      for (int i = 0; i < kNumFns && st.ok(); ++i) {
        r = d.cuModuleGetFunction(&m->fn[i], m->mod, kFnNames[i]);
        if (r != kCudaSuccess) st = cuda_error(d, r, fmt::format("kernel {}", kFnNames[i]));
      }
      if (!st.ok()) d.cuModuleUnload(m->mod);
    }
    CUcontext popped;
    d.cuCtxPopCurrent(&popped);
    if (!st.ok()) {
      d.cuDevicePrimaryCtxRelease(dev);
      return st;
    }
    return m;
  }

  std::mutex mu_;
  std::map<int, std::unique_ptr<DeviceModule>> loaded_;
};

Result<const Driver*> usable_driver() {
  if (codec_fatbin().empty()) {
    return unsupported(
        "GPU codecs: gradwire was built without CUDA kernels (GW_WITH_CUDA off or nvcc not "
        "found at configure time)");
  }
  auto d = driver();
  if (!d.ok()) return d.status().with_context("GPU codecs");
  return d;
}

struct Arg {
  const char* name;
  const void* ptr;
  size_t bytes;
  size_t align;
};

// Host-side checks that need no driver: null pointers, alignment, overlap.
Status check_args(std::string_view op, std::span<const Arg> args) {
  for (const Arg& a : args) {
    if (a.ptr == nullptr) return invalid_arg("{}: argument {} is NULL", op, a.name);
    if (reinterpret_cast<uintptr_t>(a.ptr) % a.align != 0) {
      return invalid_arg("{}: argument {} ({}) is not {}-byte aligned", op, a.name, a.ptr, a.align);
    }
  }
  for (auto i = args.begin(); i != args.end(); ++i) {
    for (auto j = i + 1; j != args.end(); ++j) {
      const auto a = reinterpret_cast<uintptr_t>(i->ptr), b = reinterpret_cast<uintptr_t>(j->ptr);
      if (a < b + j->bytes && b < a + i->bytes) {
        return invalid_arg("{}: arguments {} and {} overlap", op, i->name, j->name);
      }
    }
  }
  return ok_status();
}

// Driver-side checks: every pointer is device memory, all on one device; returns its module.
Result<const DeviceModule*> module_for(std::string_view op, std::span<const Arg> args) {
  GW_ASSIGN_OR_RETURN(const Driver* d, usable_driver());
  int device = -1;
  for (const Arg& a : args) {
    const auto p = reinterpret_cast<CUdeviceptr>(a.ptr);
    unsigned type = 0;
    int ordinal = -1;
    if (d->cuPointerGetAttribute(&type, kPointerAttrMemoryType, p) != kCudaSuccess ||
        (type != kMemoryTypeDevice && type != kMemoryTypeUnified) ||
        d->cuPointerGetAttribute(&ordinal, kPointerAttrDeviceOrdinal, p) != kCudaSuccess) {
      return invalid_arg("{}: argument {} ({}) is not CUDA device memory", op, a.name, a.ptr);
    }
    if (device >= 0 && ordinal != device) {
      return invalid_arg("{}: argument {} is on device {}, the others on device {}", op, a.name,
                         ordinal, device);
    }
    device = ordinal;
  }
  return ModuleRegistry::instance().get(*d, device);
}

// Both checks, in that order, for a kernel's arguments; returns the module to launch from.
Result<const DeviceModule*> checked_module(std::string_view op, std::span<const Arg> args) {
  GW_RETURN_IF_ERROR(check_args(op, args));
  return module_for(op, args);
}

Status launch(const DeviceModule& m, Fn fn, size_t blocks, CUstream stream, void** params) {
  const Driver& d = **driver();  // module_for succeeded, so the driver is loaded
  const unsigned grid = static_cast<unsigned>(std::clamp<size_t>(blocks, 1, size_t{1} << 30));
  CUresult r = d.cuCtxPushCurrent(m.ctx);
  if (r != kCudaSuccess) return cuda_error(d, r, "cuCtxPushCurrent");
  r = d.cuLaunchKernel(m.fn[fn], grid, 1, 1, kThreads, 1, 1, 0, stream, params, nullptr);
  CUcontext popped;
  d.cuCtxPopCurrent(&popped);
  if (r != kCudaSuccess) return cuda_error(d, r, fmt::format("launching {}", kFnNames[fn]));
  return ok_status();
}

// Blocks for an elementwise grid-stride kernel: enough to fill every SM several times over,
// no more (each thread then loops).
size_t elementwise_blocks(const DeviceModule& m, size_t items) {
  return std::min<size_t>((items + kThreads - 1) / kThreads, size_t{m.sms} * 16);
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

Status check_count(std::string_view op, size_t n, size_t elem) {
  if (n > SIZE_MAX / 8 / elem) return invalid_arg("{}: count {} is too large", op, n);
  return ok_status();
}

Status check_chunk(std::string_view op, size_t chunk) {
  if (chunk == 0 || chunk % 64 != 0 || chunk > kMaxChunk) {
    return invalid_arg("{}: chunk {} must be a multiple of 64 in 64..{}", op, chunk, kMaxChunk);
  }
  return ok_status();
}

}  // namespace

Status codecs_available() { return usable_driver().status(); }

Status encode_cast16(const float* in, float* residual, size_t n, uint16_t* out, bool bf16,
                     CUstream stream) {
  constexpr std::string_view op = "gpu encode_cast16";
  if (n == 0) return ok_status();
  GW_RETURN_IF_ERROR(check_count(op, n, 4));
  const Arg args[] = {{"in", in, n * 4, 4},
                      {"out", out, n * 2, 2},
                      {"residual", residual, n * 4, 4}};  // the residual is optional
  GW_ASSIGN_OR_RETURN(const DeviceModule* m, checked_module(op, std::span(args, residual ? 3 : 2)));
  int vec = aligned16(in) && reinterpret_cast<uintptr_t>(out) % 8 == 0 &&
            (!residual || aligned16(residual));
  const Fn fn = bf16 ? (residual ? kEncBf16Ef : kEncBf16) : (residual ? kEncF16Ef : kEncF16);
  void* params[] = {&in, &residual, &out, &n, &vec};
  return launch(*m, fn, elementwise_blocks(*m, vec ? n / 4 : n), stream, params);
}

Status decode_cast16(const uint16_t* in, size_t n, float* acc, bool bf16, bool add,
                     CUstream stream) {
  constexpr std::string_view op = "gpu decode_cast16";
  if (n == 0) return ok_status();
  GW_RETURN_IF_ERROR(check_count(op, n, 4));
  const Arg args[] = {{"in", in, n * 2, 2}, {"acc", acc, n * 4, 4}};
  GW_ASSIGN_OR_RETURN(const DeviceModule* m, checked_module(op, args));
  int vec = reinterpret_cast<uintptr_t>(in) % 8 == 0 && aligned16(acc);
  const Fn fn = bf16 ? (add ? kDecBf16Add : kDecBf16Set) : (add ? kDecF16Add : kDecF16Set);
  void* params[] = {&in, &acc, &n, &vec};
  return launch(*m, fn, elementwise_blocks(*m, vec ? n / 4 : n), stream, params);
}

size_t sign_encoded_size(size_t count, size_t chunk) {
  if (chunk == 0) return 0;
  return (count + chunk - 1) / chunk * (4 + chunk / 8);
}

Status sign_encode(const float* in, float* residual, size_t count, size_t chunk, void* out,
                   CUstream stream) {
  constexpr std::string_view op = "gpu sign_encode";
  GW_RETURN_IF_ERROR(check_chunk(op, chunk));
  if (count == 0) return ok_status();
  GW_RETURN_IF_ERROR(check_count(op, count, 4));
  const size_t bytes = sign_encoded_size(count, chunk);
  const Arg args[] = {{"in", in, count * 4, 4},
                      {"out", out, bytes, 4},
                      {"residual", residual, count * 4, 4}};  // the residual is optional
  GW_ASSIGN_OR_RETURN(const DeviceModule* mp,
                      checked_module(op, std::span(args, residual ? 3 : 2)));
  const DeviceModule& m = *mp;
  const size_t nchunks = (count + chunk - 1) / chunk;
  float* scales = static_cast<float*>(out);
  uint32_t* words = reinterpret_cast<uint32_t*>(static_cast<unsigned char*>(out) + nchunks * 4);
  const bool ef = residual != nullptr;
  // Chunks of 1, 2, 4 or 8 Ki elements over 16-byte aligned buffers stay in registers.
  Fn fn = ef ? kSignAnyEf : kSignAny;
  if (aligned16(in) && (!ef || aligned16(residual)) && chunk % 1024 == 0) {
    switch (chunk / 1024) {
      case 1:
        fn = ef ? kSignR1Ef : kSignR1;
        break;
      case 2:
        fn = ef ? kSignR2Ef : kSignR2;
        break;
      case 4:
        fn = ef ? kSignR4Ef : kSignR4;
        break;
      case 8:
        fn = ef ? kSignR8Ef : kSignR8;
        break;
      default:
        break;
    }
  }
  void* params[] = {&in, &residual, &count, &chunk, &scales, &words};
  return launch(m, fn, std::min<size_t>(nchunks, size_t{m.sms} * 16), stream, params);
}

Status sign_decode(const void* in, size_t count, size_t chunk, float* acc, bool add,
                   CUstream stream) {
  constexpr std::string_view op = "gpu sign_decode";
  GW_RETURN_IF_ERROR(check_chunk(op, chunk));
  if (count == 0) return ok_status();
  GW_RETURN_IF_ERROR(check_count(op, count, 4));
  const Arg args[] = {{"in", in, sign_encoded_size(count, chunk), 4}, {"acc", acc, count * 4, 4}};
  GW_ASSIGN_OR_RETURN(const DeviceModule* m, checked_module(op, args));
  const size_t nchunks = (count + chunk - 1) / chunk;
  const float* scales = static_cast<const float*>(in);
  const uint32_t* words =
      reinterpret_cast<const uint32_t*>(static_cast<const unsigned char*>(in) + nchunks * 4);
  int vec = aligned16(acc);
  void* params[] = {&scales, &words, &count, &chunk, &acc, &vec};
  return launch(*m, add ? kSignDecAdd : kSignDecSet, std::min<size_t>(nchunks, size_t{m->sms} * 16),
                stream, params);
}

}  // namespace gw::cuda
