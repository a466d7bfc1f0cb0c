// Keeps gw_test_support non-empty.
