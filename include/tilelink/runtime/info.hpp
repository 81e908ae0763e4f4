// What the CUDA runtime sees: devices, SMs, green-context partitioning, stream memory operations,
// peer access, MPI. For `tilelink info` (called when TILELINK_HAS_CUDA is defined).
#pragma once

#include <string>

namespace tilelink {

// A few lines of text; never throws (a missing driver or GPU is reported in the text).
std::string cuda_info();

}  // namespace tilelink
