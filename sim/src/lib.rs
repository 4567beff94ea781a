//! Simulation: the vLLM emulator, the what-if simulator, and the packing benchmark.

pub mod emulator;
pub mod model;
pub mod pack;
pub mod prometheus;
pub mod sharing_calc;
pub mod simulate;
pub mod trace;
