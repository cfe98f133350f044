// What the driver-timing programs of this folder share (event_modes.cu,
// event_scopes.cu, event_calls.cu, cpu_modes.cu): a checked driver call,
// a monotonic clock in µs, sorted samples and their median, device 0's
// primary context made current, events without timing, and the two-event
// rule's calls on a pair of streams, timed.
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

// The median of the `n` samples of `t`, which it sorts in place.
static inline double sample_median(double *t, int n) {
  sort_samples(t, n);
  return t[n / 2];
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

// A producer and a communication stream with 16 events of each kind: what
// the two-event rule's calls are timed on.
typedef struct {
  CUstream producer, comm;
  CUevent ready[16], end[16];
} Rule3;

// New streams and events in the current context.
static inline void rule3_open(Rule3 *r) {
  CHECK(cuStreamCreate(&r->producer, CU_STREAM_NON_BLOCKING));
  CHECK(cuStreamCreate(&r->comm, CU_STREAM_NON_BLOCKING));
  create_events(r->ready, 16);
  create_events(r->end, 16);
}

// Waits for the streams, then destroys them and their events.
static inline void rule3_close(Rule3 *r) {
  CHECK(cuStreamSynchronize(r->comm));
  for (int i = 0; i < 16; i++) {
    CHECK(cuEventDestroy(r->ready[i]));
    CHECK(cuEventDestroy(r->end[i]));
  }
  CHECK(cuStreamDestroy(r->producer));
  CHECK(cuStreamDestroy(r->comm));
}

// Op `i`'s calls: the input-ready record on the producer, the comm
// stream's wait on it, the end record on the comm stream.
static inline void rule3_op(Rule3 *r, int i) {
  CHECK(cuEventRecord(r->ready[i % 16], r->producer));
  CHECK(cuStreamWaitEvent(r->comm, r->ready[i % 16], 0));
  CHECK(cuEventRecord(r->end[i % 16], r->comm));
}

// µs per op of `iters` ops into `t`, after 2,000 untimed ones; the comm
// stream is synchronized every 256 ops (untimed), and at the end.
static inline void rule3_time(Rule3 *r, double *t, int iters) {
  for (int i = 0; i < iters + 2000; i++) {
    if (i % 256 == 0) CHECK(cuStreamSynchronize(r->comm));
    double t0 = now_us();
    rule3_op(r, i);
    double t1 = now_us();
    if (i >= 2000) t[i - 2000] = t1 - t0;
  }
  CHECK(cuStreamSynchronize(r->comm));
}

#endif
