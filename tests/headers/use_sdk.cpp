// use_sdk.c compiled as C++17 (the SDK promises C++ plugins the same headers).
#include "use_sdk.c"
