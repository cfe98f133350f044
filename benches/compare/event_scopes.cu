// Whether the driver's speed for the two-event rule's calls (input-ready
// record, stream wait, end record; as event_modes.cu) is fixed per
// process, per context or per pair of streams: one process times the
// calls on new pairs of streams in the primary context, then in new
// contexts (cuCtxCreate), each with streams of its own. One line of
// medians for each.
//
//   nvcc -O2 -o event_scopes event_scopes.cu -lcuda && ./event_scopes [iters] [rounds]
//
// Run in many processes (`bash .gpu/run.sh scopes` of the `wake` pack).
#include "driver_timing.h"

// Median µs per op of `iters` ops on a new pair of streams in the current
// context (after 2,000 untimed ops), the streams and events destroyed after.
static double median_on_new_streams(double *t, int iters) {
  Rule3 pair;
  rule3_open(&pair);
  rule3_time(&pair, t, iters);
  rule3_close(&pair);
  return sample_median(t, iters);
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
