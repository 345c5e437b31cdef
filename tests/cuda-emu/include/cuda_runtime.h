/* cuda_runtime.h (emulated) — the runtime API, and in C++ (kernels/) the device side (emu_device.h). */
#pragma once
#include "cuda_runtime_api.h"
#ifdef __cplusplus
#include "emu_device.h"
#endif
