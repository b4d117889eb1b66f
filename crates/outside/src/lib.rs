//! What the recorders that watch a program from outside it share: the
//! recorder of static programs (`trapline-tracer`, through ptrace) and the
//! replay of a recorded virtual machine (`trapline-vm`). Both trap the
//! allocator's entry points by symbol, keep their own view of the heap and
//! check each release against it as the agent does.

#![forbid(unsafe_code)]

pub mod checks;
pub mod heap;
pub mod traps;
