// The two-event rule's driver calls alone, timed per op: the input-ready
// record on a producer stream, the communication stream's wait on it, and
// the end record on the communication stream (no NCCL, no chorus). Median
// and p99 of `iters` ops, the producer stream synchronized every 256.
//
//   nvcc -O2 -o event_modes event_modes.cu -lcuda && ./event_modes [iters]
//
// Run in many processes (`bash .gpu/run.sh modes` of the `wake` pack), it
// shows whether a per-process spread of the enqueue lies in the driver.
#include "driver_timing.h"

int main(int argc, char **argv) {
  int iters = argc > 1 ? atoi(argv[1]) : 60000;
  if (iters <= 0) {
    fprintf(stderr, "usage: event_modes [iters > 0]\n");
    return 2;
  }
  CUstream producer, comm;
  CUevent ready[16], end[16];
  open_device0();
  CHECK(cuStreamCreate(&producer, CU_STREAM_NON_BLOCKING));
  CHECK(cuStreamCreate(&comm, CU_STREAM_NON_BLOCKING));
  create_events(ready, 16);
  create_events(end, 16);
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
  sort_samples(t, iters);
  printf("record+wait+record median %.2f us p99 %.2f us\n", t[iters / 2], t[iters * 99 / 100]);
  return 0;
}
