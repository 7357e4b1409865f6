// How the CUDA kernels of a step are launched (process-wide).
//
// Programmatic dependent launch is on by default: each decode-path kernel may be scheduled while
// the kernel before it still runs and waits on the device for it to finish (src/cuda/pdl.cuh), so
// launch latency overlaps work. Turning it off makes every kernel an ordinary launch again; the
// results are the same bits either way, only the time between kernels changes. The exl3 CLI
// turns it off with EXL3_PDL=0, to measure what it saves.
#pragma once

namespace exl3::cuda {

void set_programmatic_launch(bool on);
bool programmatic_launch();

}  // namespace exl3::cuda
