//! What runs beside the program: the writer thread, the CPU profiler,
//! the reachability scan, and the end of a process whose threads are gone.

pub mod control;
pub mod process_end;
pub mod profile;
pub mod scan;
pub mod writer;
