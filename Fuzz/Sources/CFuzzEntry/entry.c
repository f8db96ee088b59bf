// SwiftPM links an executable with `main` aliased to `<Module>_main`, which a
// harness built with -parse-as-library never defines, and libFuzzer's own
// `main` is then never pulled in. This defines that entry point and hands
// control to libFuzzer's driver, with the harness Swift exports.
#include <stddef.h>
#include <stdint.h>
#include "CFuzzEntry.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerRunDriver(int *argc, char ***argv, int (*callback)(const uint8_t *data, size_t size));

int ThreadwireFuzz_main(int argc, char **argv) {
    return LLVMFuzzerRunDriver(&argc, &argv, LLVMFuzzerTestOneInput);
}
