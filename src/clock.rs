//! Clocks: BOOTTIME and the other builtin clocks Perfetto traces use.
