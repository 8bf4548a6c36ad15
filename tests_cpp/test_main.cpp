#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstdlib>

// The test binary links libcore itself, so the loader would look for the
// CUDA plugin next to the binary; point it at the one this build made,
// unless the caller named another.
int main(int argc, char* argv[]) {
#ifdef CONCORD_TEST_CUDA_PLUGIN
  setenv("CONCORD_CUDA_PLUGIN", CONCORD_TEST_CUDA_PLUGIN, /*overwrite=*/0);
#endif
  return Catch::Session().run(argc, argv);
}
