// tilelink info: backends, devices and transports this build and machine offer.
#include <cstdio>
#include <string>
#include <thread>

#include "cli.hpp"

#if defined(TILELINK_HAS_CUDA) && __has_include("tilelink/runtime/info.hpp")
#include "tilelink/runtime/info.hpp"
#define TILELINK_INFO_CUDA 1
#endif

namespace tilelink::cli {

#if defined(TILELINK_HAS_CUDA)
int cuda_device_count();  // cuda_probe.cu
#else
int cuda_device_count() { return 0; }
#endif

namespace {

int info(Args& args) {
  args.finish();
  std::printf("tilelink\n");
  std::printf("backends:\n");
  std::printf("  cpu    built; ranks are threads of one process (%u hardware threads here)\n",
              std::thread::hardware_concurrency());
#if defined(TILELINK_HAS_CUDA)
  int n = cuda_device_count();
  std::printf("  cuda   built for sm_90a; %d device(s) visible\n", n);
#if defined(TILELINK_INFO_CUDA)
  std::printf("%s", tilelink::cuda_info().c_str());
#endif
#else
  std::printf("  cuda   not built (no nvcc at configure time)\n");
#endif
  std::printf("transports:\n");
  std::printf("  threads  cpu backend: N ranks in one process, host symmetric heap\n");
#if defined(TILELINK_HAS_CUDA)
  std::printf("  virtual, peer, ipc: cuda backend (see the cuda section above)\n");
#endif
  return 0;
}

}  // namespace

TILELINK_REGISTER_COMMAND("info", "", "list backends, devices and transports", &info);

}  // namespace tilelink::cli
