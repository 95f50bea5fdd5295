/* libcublas.so.12 for faiss-gpu-cu12 on a machine that has only cuBLAS 13 (the lent H200), built to check tqc's
 * FAISS GPU path there: nvidia-cublas-cu12 is ~500 MB and cannot travel. faiss needs these eight functions, whose C
 * signatures are the same in cuBLAS 12 and 13; each is a jump to cuBLAS 13's, found at load time. Not product code:
 * a CUDA 12 machine installs the real cuBLAS with `pip install faiss-gpu-cu12`. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#define SYMBOLS X(cublasCreate_v2) X(cublasDestroy_v2) X(cublasGemmEx) X(cublasGemmStridedBatchedEx) \
  X(cublasGetMathMode) X(cublasSetMathMode) X(cublasSetStream_v2) X(cublasSgemmEx)
#define X(name) __attribute__((visibility("hidden"))) void *real_##name;
SYMBOLS
#undef X
__attribute__((constructor)) static void load_cublas13(void) {
  const char *path = getenv("CUBLAS13_PATH");
  void *library = dlopen(path ? path : "libcublas.so.13", RTLD_NOW | RTLD_GLOBAL);
  if (!library) { fprintf(stderr, "cublas12 shim: %s\n", dlerror()); abort(); }
#define X(name) if (!(real_##name = dlsym(library, #name))) { fprintf(stderr, "cublas12 shim: no %s\n", #name); abort(); }
  SYMBOLS
#undef X
}
#define X(name) __asm__(".globl " #name "\n.type " #name ",@function\n" #name ":\n\tjmp *real_" #name "(%rip)\n");
SYMBOLS
