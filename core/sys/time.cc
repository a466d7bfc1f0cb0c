#include "core/sys/time.h"

#include <climits>

namespace gw::sys {

int ms_until(Deadline deadline) {
  auto now = Clock::now();
  if (deadline <= now) return 0;
  auto ms = std::chrono::ceil<std::chrono::milliseconds>(deadline - now).count();
  return ms > INT32_MAX ? INT32_MAX : static_cast<int>(ms);
}

int64_t ns_until(Deadline deadline) {
  auto now = Clock::now();
  if (deadline <= now) return 0;
  return std::chrono::duration_cast<std::chrono::nanoseconds>(deadline - now).count();
}

}  // namespace gw::sys
