// Whether the two-event rule's driver calls slow down on their own or with
// the CPU that runs them: in short windows, in turn, one process times
// (a) a chain of dependent multiplications (the core's speed), (b) a
// pointer chase through 1 MiB (its caches), (c) one through 256 MiB (main
// memory) and (d) the driver calls of event_modes.cu, then counts the
// windows in which each ran slow (over 1.25x its own 12.5th percentile),
// and how often each was slow together with the driver calls.
//
//   nvcc -O2 -o cpu_modes cpu_modes.cu -lcuda && ./cpu_modes [windows]
//
// Run in many processes (`bash .gpu/run.sh cpu` of the `wake` pack).
#include <stdint.h>
#include <string.h>

#include "driver_timing.h"

static double quantile(const double *v, int n, double q, double *scratch) {
  memcpy(scratch, v, sizeof(double) * n);
  sort_samples(scratch, n);
  return scratch[(int)(q * (n - 1))];
}

#define CHASE (1 << 17)    /* 1 MiB of 8-byte slots */
#define FAR_CHASE (1 << 25) /* 256 MiB of them */
#define REPS 9             /* samples per window and measure; the median kept */

// One cycle through all `n` slots of `next` in a shuffled order (Sattolo).
static void make_cycle(uint64_t *next, uint64_t n, uint64_t seed) {
  for (uint64_t i = 0; i < n; i++) next[i] = i;
  for (uint64_t i = n - 1; i > 0; i--) {
    seed ^= seed << 13; seed ^= seed >> 7; seed ^= seed << 17;
    uint64_t j = seed % i, t = next[i];
    next[i] = next[j]; next[j] = t;
  }
}

// Median ns per step of REPS runs of `steps` steps of the chase from `*p`.
static double chase(const uint64_t *next, uint64_t *p, int steps, double *s, double *scratch) {
  for (int r = 0; r < REPS; r++) {
    double t0 = now_us();
    for (int i = 0; i < steps; i++) *p = next[*p];
    s[r] = (now_us() - t0) * 1e3 / steps;
  }
  return quantile(s, REPS, 0.5, scratch);
}

int main(int argc, char **argv) {
  int windows = argc > 1 ? atoi(argv[1]) : 200;
  if (windows < 8 || windows > 100000) {
    fprintf(stderr, "usage: cpu_modes [windows 8..100000]\n");
    return 2;
  }
  double *alu = (double *)malloc(sizeof(double) * windows);
  double *mem = (double *)malloc(sizeof(double) * windows);
  double *far = (double *)malloc(sizeof(double) * windows);
  double *drv = (double *)malloc(sizeof(double) * windows);
  double *scratch = (double *)malloc(sizeof(double) * (windows + REPS));
  uint64_t *next = (uint64_t *)malloc(sizeof(uint64_t) * CHASE);
  uint64_t *far_next = (uint64_t *)malloc(sizeof(uint64_t) * FAR_CHASE);
  if (!alu || !mem || !far || !drv || !scratch || !next || !far_next) {
    fprintf(stderr, "cannot hold %d windows and the chases\n", windows);
    return 1;
  }
  make_cycle(next, CHASE, 88172645463325252ull);
  make_cycle(far_next, FAR_CHASE, 2463534242ull);
  Rule3 pair;
  open_device0();
  rule3_open(&pair);
  volatile uint64_t sink = 0;
  uint64_t p = 0, q = 0;
  double s[REPS];
  for (int w = 0; w < windows + 4; w++) {
    // (a) 20,000 dependent multiply-adds, ns each.
    for (int r = 0; r < REPS; r++) {
      uint64_t x = (uint64_t)w + 1;
      double t0 = now_us();
      for (int i = 0; i < 20000; i++) x = x * 6364136223846793005ull + 1442695040888963407ull;
      s[r] = (now_us() - t0) * 1e3 / 20000;
      sink += x;
    }
    double a = quantile(s, REPS, 0.5, scratch);
    // (b) 20,000 steps of the near chase, (c) 2,000 of the far one, ns each.
    double m = chase(next, &p, 20000, s, scratch);
    double f = chase(far_next, &q, 2000, s, scratch);
    sink += p + q;
    // (d) 256 ops of the three driver calls, µs each.
    for (int r = 0; r < REPS; r++) {
      CHECK(cuStreamSynchronize(pair.comm));
      double t0 = now_us();
      for (int i = 0; i < 256; i++) {
        rule3_op(&pair, i);
      }
      s[r] = (now_us() - t0) / 256;
    }
    double d = quantile(s, REPS, 0.5, scratch);
    if (w >= 4) {
      alu[w - 4] = a;
      mem[w - 4] = m;
      far[w - 4] = f;
      drv[w - 4] = d;
    }
  }
  rule3_close(&pair);
  // Slow: over 1.25x the measure's 12.5th percentile.
  double fa = 1.25 * quantile(alu, windows, 0.125, scratch);
  double fm = 1.25 * quantile(mem, windows, 0.125, scratch);
  double ff = 1.25 * quantile(far, windows, 0.125, scratch);
  double fd = 1.25 * quantile(drv, windows, 0.125, scratch);
  int sa = 0, sm = 0, sf = 0, sd = 0, sda = 0, sdm = 0, sdf = 0;
  for (int w = 0; w < windows; w++) {
    int a = alu[w] > fa, m = mem[w] > fm, f = far[w] > ff, d = drv[w] > fd;
    sa += a; sm += m; sf += f; sd += d; sda += d && a; sdm += d && m; sdf += d && f;
  }
  printf("windows %d | medians: multiply %.3f ns, 1 MiB chase %.2f ns, 256 MiB chase %.1f ns,"
         " driver calls %.2f us | slow windows: multiply %d, 1 MiB %d, 256 MiB %d, driver %d;"
         " with the driver's: multiply %d, 1 MiB %d, 256 MiB %d\n",
         windows, quantile(alu, windows, 0.5, scratch), quantile(mem, windows, 0.5, scratch),
         quantile(far, windows, 0.5, scratch), quantile(drv, windows, 0.5, scratch), sa, sm, sf,
         sd, sda, sdm, sdf);
  return sink == 42 ? 3 : 0;
}
