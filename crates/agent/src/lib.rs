//! trapline's agent: a library preloaded into the traced program.
//!
//! It interposes the allocation functions (and the process lifecycle
//! functions that end or replace a trace), keeps a table of live blocks,
//! detects misuse as it happens, captures call stacks, and appends events to
//! per-thread buffers that a writer thread compresses into the trace file.
//! See docs/design.md for the mechanisms. All of trapline's `unsafe` is here.

mod allocator_maps;
mod arch;
mod clock;
mod heap;
mod hooks;
mod lifecycle;
mod live;
mod modules;
mod next_alloc;
mod private_operators;
mod process_end;
mod profile;
mod record;
mod rules;
mod scan;
mod side_stack;
mod stacks;
mod sync;
mod sys;
mod tasks;
mod thread;
mod threads;
mod totals;
mod untracked;
mod unwind;
mod writer;

/// The agent's own allocations never touch the program's heap (heap.rs).
#[global_allocator]
pub(crate) static AGENT_HEAP: heap::AgentHeap = heap::AgentHeap::new();

extern "C" fn constructor() {
    lifecycle::init();
}

/// Runs `constructor` when the dynamic loader initialises the library.
#[used]
#[link_section = ".init_array"]
static INIT: extern "C" fn() = constructor;

// The unwinder Rust's runtime needs (`_Unwind_*`), linked in from GCC's
// static `libgcc_eh.a` ahead of `libgcc_s.so.1`, whose load and constructor
// (`cpuid`, a trap to the hypervisor in a VM) cost every process image about
// 0.1 ms. The agent's version script keeps these symbols local, so the
// program's own C++ runtime still unwinds with its `libgcc_s`.
#[link(name = "gcc_eh", kind = "static")]
extern "C" {}
