/* nn_set_input_2024_06_25.c - the set-input guest (nn_set_input.h) built for wasi:nn@0.2.0-rc-2024-06-25,
 * with its error constructor. */
#define NN_VERSION "0.2.0-rc-2024-06-25"
#define NN_ERROR_CONSTRUCTOR
#include "nn_set_input.h"
