// The libFuzzer entry point for the threadwire harness (see entry.c).
int ThreadwireFuzz_main(int argc, char **argv);
