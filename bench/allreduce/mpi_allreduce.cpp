// mpi_allreduce.cpp — MPI_Allreduce bus bandwidth, the reference for
// bench/allreduce: same sizes, same timing rule as conveyor_gloo.bench
// (barrier, time every rank, slowest rank per iteration, median).
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, n = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  std::string label = argc > 1 ? argv[1] : "mpi";
  int reps = argc > 2 ? std::atoi(argv[2]) : 10;
  for (std::size_t bytes : {4096ul, 65536ul, 1ul << 20, 4ul << 20, 16ul << 20, 64ul << 20}) {
    std::vector<float> in(bytes / 4, 1.f), out(bytes / 4);
    int r = bytes >= (16u << 20) ? reps : reps * 3;
    for (int i = 0; i < 3; ++i)
      MPI_Allreduce(in.data(), out.data(), int(in.size()), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    std::vector<double> times;
    for (int i = 0; i < r; ++i) {
      MPI_Barrier(MPI_COMM_WORLD);
      double t0 = MPI_Wtime();
      MPI_Allreduce(in.data(), out.data(), int(in.size()), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      double dt = MPI_Wtime() - t0, worst = 0;
      MPI_Allreduce(&dt, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      times.push_back(worst);
    }
    std::nth_element(times.begin(), times.begin() + times.size() / 2, times.end());
    double med = times[times.size() / 2];
    if (rank == 0)
      std::printf("%s %d %zu %.1f %.3f\n", label.c_str(), n, bytes, med * 1e6,
                  2.0 * (n - 1) / n * double(bytes) / med / 1e9);
  }
  MPI_Finalize();
  return 0;
}
