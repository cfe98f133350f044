// Whether the driver's speed for the two-event rule's calls (input-ready
// record, stream wait, end record; as event_modes.cu) is fixed per
// process, per context or per pair of streams: one process times the
// calls on the primary context's first streams several times over, then
// on new streams in the same context, then in new contexts
// (cuCtxCreate), each with streams of its own. One median per line.
//
//   nvcc -O2 -o event_scopes event_scopes.cu -lcuda && ./event_scopes [iters] [rounds]
//
// Run in many processes (`bash .gpu/run.sh scopes` of the `wake` pack).
#include "driver_timing.h"

// Median µs per op of `iters` ops on a new pair of streams in the current
// context (after 2,000 untimed ops), the streams and events destroyed after.
static double median_on_new_streams(double *t, int iters) {
  CUstream producer, comm;
  CUevent ready[16], end[16];
  CHECK(cuStreamCreate(&producer, CU_STREAM_NON_BLOCKING));
  CHECK(cuStreamCreate(&comm, CU_STREAM_NON_BLOCKING));
  create_events(ready, 16);
  create_events(end, 16);
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
  for (int i = 0; i < 16; i++) {
    CHECK(cuEventDestroy(ready[i]));
    CHECK(cuEventDestroy(end[i]));
  }
  CHECK(cuStreamDestroy(producer));
  CHECK(cuStreamDestroy(comm));
  sort_samples(t, iters);
  return t[iters / 2];
}

int main(int argc, char **argv) {
  int iters = argc > 1 ? atoi(argv[1]) : 30000;
  int rounds = argc > 2 ? atoi(argv[2]) : 4;
  if (iters <= 0 || rounds <= 0 || rounds > 64) {
    fprintf(stderr, "usage: event_scopes [iters > 0] [rounds 1..64]\n");
    return 2;
  }
  double *t = (double *)malloc(sizeof(double) * iters);
  if (t == NULL) {
    fprintf(stderr, "cannot hold %d samples\n", iters);
    return 1;
  }
  CUdevice dev = open_device0();
  CUcontext primary;
  CHECK(cuCtxGetCurrent(&primary));
  printf("new streams, primary context:");
  for (int r = 0; r < rounds; r++) printf(" %.2f", median_on_new_streams(t, iters));
  printf("\nnew contexts:");
  for (int r = 0; r < rounds; r++) {
    CUcontext ctx;
#if CUDA_VERSION >= 13000
    // CUDA 13's cuCtxCreate takes creation parameters; none: a plain context.
    CUctxCreateParams params = {0};
    CHECK(cuCtxCreate(&ctx, &params, 0, dev));
#else
    CHECK(cuCtxCreate(&ctx, 0, dev));
#endif
    printf(" %.2f", median_on_new_streams(t, iters));
    CHECK(cuCtxDestroy(ctx));
    CHECK(cuCtxSetCurrent(primary));
  }
  printf("\n");
  free(t);
  return 0;
}
