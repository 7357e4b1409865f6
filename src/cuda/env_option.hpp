// Tuning overrides from the environment, shared by the CUDA layers' *_options_from_env.
#pragma once

#include <cstdint>

namespace exl3::cuda::detail {

// Sets `field` from the positive integer in environment variable `name`; unset or blank leaves it.
// Anything else fails, naming the variable and its value.
void env_override(const char* name, int64_t& field);

}  // namespace exl3::cuda::detail
