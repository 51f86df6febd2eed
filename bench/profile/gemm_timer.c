// LD_PRELOAD profiler for the DistJax benchmarks: wraps oneDNN's C entry points
// dnnl_primitive_execute (the cached matmul primitives of tensor::matmul/linear) and
// dnnl_sgemm (attention's blocked GEMMs), and prints at exit the time and FLOPs spent
// in them, per shape. Not part of `make bench`; see bench/README.md ("Profiling").
//
//   gcc -O2 -shared -fPIC -o /tmp/gemm_timer.so bench/profile/gemm_timer.c -ldl
//   LD_PRELOAD=/tmp/gemm_timer.so build/bench_train --threads 1 --model gpt
#define _GNU_SOURCE
#include <dlfcn.h>
#include <dnnl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct { char key[96]; double sec; double flops; long calls; } Entry;
static Entry table[512];
static int n_entries;
static double total_sec, total_flops;
static long total_calls;

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

static void add(const char* key, double sec, double flops) {
  total_sec += sec; total_flops += flops; total_calls++;
  for (int i = 0; i < n_entries; ++i)
    if (strcmp(table[i].key, key) == 0) { table[i].sec += sec; table[i].flops += flops; table[i].calls++; return; }
  if (n_entries < 512) {
    snprintf(table[n_entries].key, sizeof table[n_entries].key, "%s", key);
    table[n_entries].sec = sec; table[n_entries].flops = flops; table[n_entries].calls = 1;
    n_entries++;
  }
}

static int cmp(const void* a, const void* b) {
  double x = ((const Entry*)a)->sec, y = ((const Entry*)b)->sec;
  return x < y ? 1 : x > y ? -1 : 0;
}

__attribute__((destructor)) static void report(void) {
  qsort(table, n_entries, sizeof(Entry), cmp);
  FILE* f = stderr;
  const char* path = getenv("GEMM_TIMER_OUT");
  if (path && *path) f = fopen(path, "w");
  if (!f) f = stderr;
  fprintf(f, "gemm_timer: %ld calls, %.3f s, %.2f GFLOP, %.1f GFLOP/s\n", total_calls, total_sec,
          total_flops * 1e-9, total_sec > 0 ? total_flops / total_sec * 1e-9 : 0.0);
  for (int i = 0; i < n_entries && i < 40; ++i)
    fprintf(f, "  %-48s calls %8ld  %8.3f s  %6.1f%%  %6.1f GFLOP/s  %8.1f us/call\n", table[i].key,
            table[i].calls, table[i].sec, 100.0 * table[i].sec / total_sec,
            table[i].sec > 0 ? table[i].flops / table[i].sec * 1e-9 : 0.0, 1e6 * table[i].sec / table[i].calls);
  if (f != stderr) fclose(f);
}

typedef dnnl_status_t (*exec_fn)(const_dnnl_primitive_t, dnnl_stream_t, int, const dnnl_exec_arg_t*);
typedef dnnl_status_t (*sgemm_fn)(char, char, dnnl_dim_t, dnnl_dim_t, dnnl_dim_t, float, const float*,
                                  dnnl_dim_t, const float*, dnnl_dim_t, float, float*, dnnl_dim_t);

dnnl_status_t dnnl_primitive_execute(const_dnnl_primitive_t p, dnnl_stream_t s, int nargs,
                                     const dnnl_exec_arg_t* args) {
  static exec_fn real;
  if (!real) real = (exec_fn)dlsym(RTLD_NEXT, "dnnl_primitive_execute");
  const double t0 = now();
  dnnl_status_t st = real(p, s, nargs, args);
  const double dt = now() - t0;
  const_dnnl_primitive_desc_t pd;
  char key[96] = "primitive";
  double flops = 0;
  if (dnnl_primitive_get_primitive_desc(p, &pd) == dnnl_success) {
    const dnnl_memory_desc_t* a = dnnl_primitive_desc_query_md(pd, dnnl_query_src_md, 0);
    const dnnl_memory_desc_t* w = dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
    if (a && w && a->ndims == 3 && w->ndims == 3) {
      long b = a->dims[0], m = a->dims[1], k = a->dims[2], n = w->dims[2];
      int ta = a->format_kind == dnnl_blocked && a->format_desc.blocking.strides[1] == 1 && m > 1;
      int tb = w->format_kind == dnnl_blocked && w->format_desc.blocking.strides[1] == 1 && k > 1;
      snprintf(key, sizeof key, "matmul b%ld %ldx%ldx%ld (MxKxN) %c%c", b, m, k, n, ta ? 'T' : 'N', tb ? 'T' : 'N');
      flops = 2.0 * b * m * n * k;
    }
  }
  add(key, dt, flops);
  return st;
}

dnnl_status_t dnnl_sgemm(char ta, char tb, dnnl_dim_t m, dnnl_dim_t n, dnnl_dim_t k, float alpha,
                         const float* a, dnnl_dim_t lda, const float* b, dnnl_dim_t ldb, float beta,
                         float* c, dnnl_dim_t ldc) {
  static sgemm_fn real;
  if (!real) real = (sgemm_fn)dlsym(RTLD_NEXT, "dnnl_sgemm");
  const double t0 = now();
  dnnl_status_t st = real(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  const double dt = now() - t0;
  char key[96];
  // Attention's blocks: bucket kmax so the table stays short.
  snprintf(key, sizeof key, "sgemm %c%c m%ld n%s k%s", ta, tb, (long)m, n > 64 ? "<=128" : "64",
           k > 64 ? "<=128" : (k == 64 ? "64" : "<64"));
  add(key, dt, 2.0 * m * n * k);
  return st;
}
