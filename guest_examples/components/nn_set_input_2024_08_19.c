/* nn_set_input_2024_08_19.c - the set-input guest (nn_set_input.h) built for wasi:nn@0.2.0-rc-2024-08-19. */
#define NN_VERSION "0.2.0-rc-2024-08-19"
#include "nn_set_input.h"
