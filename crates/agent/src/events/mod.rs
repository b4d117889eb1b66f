//! Per-thread state and buffers, and the recording of allocation, lock
//! and thread events into them.

pub mod buffers;
pub mod call_counts;
pub mod calls;
pub mod held;
pub mod next_alloc;
pub mod production;
pub mod production_sync;
pub mod record;
pub mod sampling;
pub mod sync;
pub mod thread;
pub mod threads;
pub mod totals;
