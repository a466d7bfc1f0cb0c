// Which sanitizer this test binary was built with, for the few cases that cannot run under one.
#pragma once

// GCC says __SANITIZE_THREAD__ / __SANITIZE_ADDRESS__; clang answers __has_feature.
#if defined(__has_feature)
#define GW_TEST_HAS_FEATURE(x) __has_feature(x)
#else
#define GW_TEST_HAS_FEATURE(x) 0
#endif

namespace gw::testing {

#if defined(__SANITIZE_THREAD__) || GW_TEST_HAS_FEATURE(thread_sanitizer)
inline constexpr bool kThreadSanitizer = true;
#else
inline constexpr bool kThreadSanitizer = false;
#endif

#if defined(__SANITIZE_ADDRESS__) || GW_TEST_HAS_FEATURE(address_sanitizer)
inline constexpr bool kAddressSanitizer = true;
#else
inline constexpr bool kAddressSanitizer = false;
#endif

// Either of them: the builds whose timings say nothing of a release build's.
inline constexpr bool kSanitizer = kThreadSanitizer || kAddressSanitizer;

}  // namespace gw::testing
