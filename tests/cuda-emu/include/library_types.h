/* library_types.h (emulated) — cudaDataType lives in cuda_runtime_api.h. */
#pragma once
#include "cuda_runtime_api.h"
