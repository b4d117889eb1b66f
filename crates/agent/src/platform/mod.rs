//! The bottom layer: the C library, the kernel and the CPU (syscalls,
//! futexes and locks, the agent's own allocator, clocks, signals, the
//! process's tasks and mappings). Imports nothing of the agent's above it.

pub mod agent_threads;
pub mod arch;
pub mod callback;
pub mod clock;
pub mod futex;
pub mod heap;
pub mod hold;
pub mod imports;
pub mod lock;
pub mod proc_maps;
pub mod side_stack;
pub mod signals;
pub mod sys;
pub mod tasks;
pub mod uffd;
