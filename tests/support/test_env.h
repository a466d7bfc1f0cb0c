// Small helpers the unit tests share.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace gw::testing {

// Whether this build runs under a sanitizer (ASan or TSan), where exhaustive simulations run
// 10-20 times slower: they then cover fewer layouts (the release build covers all of them).
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
inline constexpr bool kSanitized = true;
#else
inline constexpr bool kSanitized = false;
#endif

// The most ranks the exhaustive schedule simulations try: 33 (every uniform layout up to 33
// ranks), 17 under a sanitizer.
inline constexpr int kSimMaxRanks = kSanitized ? 17 : 33;

inline int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Sets (value != nullptr) or unsets an environment variable for one scope and restores the old
// value afterwards.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value != nullptr) {
      setenv(name, value, 1);
    } else {
      unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (old_) {
      setenv(name_, old_->c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

// Clears the launcher and store variables (GW_*, torchrun's, Open MPI's, Slurm's) for one scope,
// so ranks as threads take their settings from their gw_config_t only.
class CleanEnv {
 public:
  CleanEnv() {
    for (const char* v :
         {"GW_RANK", "GW_WORLD_SIZE", "GW_STORE", "GW_JOB_TOKEN", "GW_TIMEOUT_MS", "GW_DAEMON",
          "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
          "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS"}) {
      env_.push_back(std::make_unique<ScopedEnv>(v, nullptr));
    }
  }

 private:
  std::vector<std::unique_ptr<ScopedEnv>> env_;
};

}  // namespace gw::testing
