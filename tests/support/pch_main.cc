// The target that compiles the gtest binaries' precompiled header (gw_test_pch,
// tests/CMakeLists.txt); every gtest executable reuses it. It runs nothing.
int main() { return 0; }
