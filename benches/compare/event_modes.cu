// The two-event rule's driver calls alone, timed per op: the input-ready
// record on a producer stream, the communication stream's wait on it, and
// the end record on the communication stream (no NCCL, no chorus). Median
// and p99 of `iters` ops, the producer stream synchronized every 256.
//
//   nvcc -O2 -o event_modes event_modes.cu -lcuda && ./event_modes [iters]
//
// Run in many processes (`bash .gpu/run.sh modes` of the `wake` pack), it
// shows whether a per-process spread of the enqueue lies in the driver.
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define CHECK(x) do { CUresult r_ = (x); if (r_ != CUDA_SUCCESS) { \
  fprintf(stderr, "%s failed: %d\n", #x, (int)r_); exit(1); } } while (0)

static double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e6 + t.tv_nsec * 1e-3;
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

int main(int argc, char **argv) {
  int iters = argc > 1 ? atoi(argv[1]) : 60000;
  if (iters <= 0) {
    fprintf(stderr, "usage: event_modes [iters > 0]\n");
    return 2;
  }
  CUdevice dev;
  CUcontext ctx;
  CUstream producer, comm;
  CUevent ready[16], end[16];
  CHECK(cuInit(0));
  CHECK(cuDeviceGet(&dev, 0));
  CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
  CHECK(cuCtxSetCurrent(ctx));
  CHECK(cuStreamCreate(&producer, CU_STREAM_NON_BLOCKING));
  CHECK(cuStreamCreate(&comm, CU_STREAM_NON_BLOCKING));
  for (int i = 0; i < 16; i++) {
    CHECK(cuEventCreate(&ready[i], CU_EVENT_DISABLE_TIMING));
    CHECK(cuEventCreate(&end[i], CU_EVENT_DISABLE_TIMING));
  }
  double *t = (double *)malloc(sizeof(double) * iters);
  if (t == NULL) {
    fprintf(stderr, "cannot hold %d samples\n", iters);
    return 1;
  }
  for (int i = 0; i < iters + 2000; i++) {
    if (i % 256 == 0) CHECK(cuStreamSynchronize(comm));
    double t0 = now_us();
    CHECK(cuEventRecord(ready[i % 16], producer));
    CHECK(cuStreamWaitEvent(comm, ready[i % 16], 0));
    CHECK(cuEventRecord(end[i % 16], comm));
    double t1 = now_us();
    if (i >= 2000) t[i - 2000] = t1 - t0;
  }
  CHECK(cuStreamSynchronize(comm));
  qsort(t, iters, sizeof(double), cmp);
  printf("record+wait+record median %.2f us p99 %.2f us\n", t[iters / 2], t[iters * 99 / 100]);
  return 0;
}
