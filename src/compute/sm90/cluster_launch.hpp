// A launch configuration of blocks in thread-block clusters along x (the decode kernel's forms).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "tilelink/compute/sm90/impl/check_cuda.hpp"

namespace tilelink::compute::sm90::detail {

struct ClusterLaunch {
  cudaLaunchConfig_t config = {};
  cudaLaunchAttribute attr[1] = {};

  ClusterLaunch(int64_t blocks, int threads, size_t smem_bytes, int cluster, cudaStream_t stream) {
    config.gridDim = dim3(static_cast<unsigned>(blocks));
    config.blockDim = dim3(static_cast<unsigned>(threads));
    config.dynamicSmemBytes = smem_bytes;
    config.stream = stream;
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = static_cast<unsigned>(cluster);
    attr[0].val.clusterDim.y = 1, attr[0].val.clusterDim.z = 1;
    config.attrs = attr, config.numAttrs = 1;
  }
  ClusterLaunch(const ClusterLaunch&) = delete;  // config.attrs points into it
  ClusterLaunch& operator=(const ClusterLaunch&) = delete;

  template <class Kernel, class Params>
  void launch(Kernel kernel, const Params& p) const {
    TL_SM90_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, p));
  }
  // Clusters of this configuration that the current device holds at once (0: none).
  template <class Kernel>
  int max_active_clusters(Kernel kernel) const {
    int clusters = 0;
    TL_SM90_CUDA_CHECK(cudaOccupancyMaxActiveClusters(&clusters, kernel, &config));
    return clusters;
  }
};

}  // namespace tilelink::compute::sm90::detail
