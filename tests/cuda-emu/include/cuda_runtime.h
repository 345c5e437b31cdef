#pragma once
#include "cuda_runtime_api.h"
#ifdef __cplusplus
#include "emu_device.h"
#endif
