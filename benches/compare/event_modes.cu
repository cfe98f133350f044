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
  Rule3 pair;
  open_device0();
  rule3_open(&pair);
  double *t = (double *)malloc(sizeof(double) * iters);
  if (t == NULL) {
    fprintf(stderr, "cannot hold %d samples\n", iters);
    return 1;
  }
  rule3_time(&pair, t, iters);
  sort_samples(t, iters);
  printf("record+wait+record median %.2f us p99 %.2f us\n", t[iters / 2], t[iters * 99 / 100]);
  return 0;
}
