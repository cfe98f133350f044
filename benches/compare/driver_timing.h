// What the driver-timing programs of this folder share (event_modes.cu,
// event_scopes.cu, event_calls.cu, cpu_modes.cu): a checked driver call,
// a monotonic clock in µs, sorted samples, device 0's primary context
// made current, and events without timing.
#ifndef CHORUS_DRIVER_TIMING_H
#define CHORUS_DRIVER_TIMING_H

#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

// Exits with the call and its result if a driver call fails.
#define CHECK(x) do { CUresult r_ = (x); if (r_ != CUDA_SUCCESS) { \
  fprintf(stderr, "%s failed: %d\n", #x, (int)r_); exit(1); } } while (0)

static inline double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e6 + t.tv_nsec * 1e-3;
}

static inline int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

// Sorts the `n` samples of `t` in place.
static inline void sort_samples(double *t, int n) {
  qsort(t, (size_t)n, sizeof(double), cmp_double);
}

// Initializes the driver and makes device 0's primary context current.
static inline CUdevice open_device0(void) {
  CUdevice dev;
  CUcontext ctx;
  CHECK(cuInit(0));
  CHECK(cuDeviceGet(&dev, 0));
  CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
  CHECK(cuCtxSetCurrent(ctx));
  return dev;
}

// `n` events without timing, the kind the two-event rule records.
static inline void create_events(CUevent *ev, int n) {
  for (int i = 0; i < n; i++) CHECK(cuEventCreate(&ev[i], CU_EVENT_DISABLE_TIMING));
}

#endif
