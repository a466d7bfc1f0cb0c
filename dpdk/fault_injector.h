// Seeded fault injection on the transmit path (the kernel here has no netem): each frame is
// dropped, duplicated or held back behind later frames (reordered) with the given probabilities.
//
// Thread-safety: none; the engine calls it under its lock.
#pragma once

#include <cstdint>
#include <random>

namespace gw::dpdk {

struct FaultConfig {
  double loss = 0;     // probability that a frame is dropped
  double reorder = 0;  // probability that a frame is held back behind the next frames
  double dup = 0;      // probability that a frame is sent twice
  uint64_t seed = 1;
  bool any() const { return loss > 0 || reorder > 0 || dup > 0; }
};

enum class FaultAction : uint8_t { kPass, kDrop, kDup, kHold };

class FaultInjector {
 public:
  explicit FaultInjector(const FaultConfig& config) : config_(config), rng_(config.seed) {}
  const FaultConfig& config() const { return config_; }
  bool enabled() const { return config_.any(); }
  // Decides the fate of one frame. The checks are exclusive, in the order drop, dup, hold.
  FaultAction decide() {
    if (!config_.any()) return FaultAction::kPass;
    const double u = dist_(rng_);
    if (u < config_.loss) return FaultAction::kDrop;
    if (u < config_.loss + config_.dup) return FaultAction::kDup;
    if (u < config_.loss + config_.dup + config_.reorder) return FaultAction::kHold;
    return FaultAction::kPass;
  }
  // How many later frames a held frame waits behind (1..8).
  int hold_distance() { return 1 + static_cast<int>(rng_() % 8); }

 private:
  FaultConfig config_;
  std::mt19937_64 rng_;
  std::uniform_real_distribution<double> dist_{0.0, 1.0};
};

}  // namespace gw::dpdk
