// Test main of the integration suites: runs a child role when re-executed by
// child_process::spawn ("--conveyor-child <role> ..."), else GoogleTest.
#include <gtest/gtest.h>

#include "common/process.hpp"

int main(int argc, char** argv) {
  if (cvt::is_child_invocation(argc, argv)) return cvt::child_main(argc, argv);
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
