/* cuda_bf16.h (emulated) — the 16- and 8-bit float types live in emu_device.h. */
#pragma once
#include "cuda_runtime.h"
