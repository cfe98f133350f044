// Which stream the driver's speed for the two-event rule's calls follows:
// each call timed on its own (the input-ready record on the producer
// stream, the communication stream's wait on it, the end record on the
// communication stream), first with one producer stream and several new
// communication streams, then with one communication stream and several
// new producer streams. One line per pair: the three calls' medians.
//
//   nvcc -O2 -o event_calls event_calls.cu -lcuda && ./event_calls [iters] [streams]
//
// Run in many processes (`bash .gpu/run.sh calls` of the `wake` pack).
#include "driver_timing.h"

// The three calls' medians (µs) on `producer` and `comm`, `iters` ops after
// 2,000 untimed ones.
static void time_pair(CUstream producer, CUstream comm, int iters, double *t, char *label) {
  CUevent ready[16], end[16];
  create_events(ready, 16);
  create_events(end, 16);
  double *rec = t, *wait = t + iters, *endrec = t + 2 * iters;
  for (int i = 0; i < iters + 2000; i++) {
    if (i % 256 == 0) CHECK(cuStreamSynchronize(comm));
    double t0 = now_us();
    CHECK(cuEventRecord(ready[i % 16], producer));
    double t1 = now_us();
    CHECK(cuStreamWaitEvent(comm, ready[i % 16], 0));
    double t2 = now_us();
    CHECK(cuEventRecord(end[i % 16], comm));
    double t3 = now_us();
    if (i >= 2000) {
      rec[i - 2000] = t1 - t0;
      wait[i - 2000] = t2 - t1;
      endrec[i - 2000] = t3 - t2;
    }
  }
  CHECK(cuStreamSynchronize(comm));
  for (int i = 0; i < 16; i++) {
    CHECK(cuEventDestroy(ready[i]));
    CHECK(cuEventDestroy(end[i]));
  }
  printf("%s: record on producer %.2f, wait on comm %.2f, record on comm %.2f us\n", label,
         sample_median(rec, iters), sample_median(wait, iters), sample_median(endrec, iters));
}

int main(int argc, char **argv) {
  int iters = argc > 1 ? atoi(argv[1]) : 20000;
  int streams = argc > 2 ? atoi(argv[2]) : 4;
  if (iters <= 0 || iters > 10000000 || streams <= 0 || streams > 64) {
    fprintf(stderr, "usage: event_calls [iters 1..10^7] [streams 1..64]\n");
    return 2;
  }
  double *t = (double *)malloc(sizeof(double) * 3 * (size_t)iters);
  if (t == NULL) {
    fprintf(stderr, "cannot hold %d samples\n", iters);
    return 1;
  }
  open_device0();
  CUstream p0, c0;
  CHECK(cuStreamCreate(&p0, CU_STREAM_NON_BLOCKING));
  CHECK(cuStreamCreate(&c0, CU_STREAM_NON_BLOCKING));
  // Every new stream stays alive to the end, so that none is made anew
  // from a destroyed one's resources.
  CUstream made[128];
  char label[64];
  for (int s = 0; s < streams; s++) {
    CHECK(cuStreamCreate(&made[s], CU_STREAM_NON_BLOCKING));
    snprintf(label, sizeof label, "producer 0, comm %d", s + 1);
    time_pair(p0, made[s], iters, t, label);
  }
  for (int s = 0; s < streams; s++) {
    CHECK(cuStreamCreate(&made[streams + s], CU_STREAM_NON_BLOCKING));
    snprintf(label, sizeof label, "producer %d, comm 0", s + 1);
    time_pair(made[streams + s], c0, iters, t, label);
  }
  for (int s = 0; s < 2 * streams; s++) CHECK(cuStreamDestroy(made[s]));
  free(t);
  return 0;
}
