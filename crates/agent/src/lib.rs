//! trapline's agent: a library preloaded into the traced program.
//!
//! It interposes the allocation functions (and the process lifecycle
//! functions that end or replace a trace), keeps a table of live blocks,
//! detects misuse as it happens, captures call stacks, and appends events to
//! per-thread buffers that a writer thread compresses into the trace file.
//! See docs/agent.md and docs/recording.md for the mechanisms. All of trapline's `unsafe` is here.

mod capture;
mod config;
mod events;
mod hooks;
mod phase;
mod platform;
mod runtime;
mod services;
mod tracking;

/// The agent's own allocations never touch the program's heap (heap.rs).
#[global_allocator]
pub(crate) static AGENT_HEAP: platform::heap::AgentHeap = platform::heap::AgentHeap::new();

extern "C" fn constructor() {
    // Not in the crate's unit-test binary: that would record the test
    // harness itself, into a trace file left in the source tree.
    if cfg!(test) {
        return;
    }
    // Loaded into a running process (`trapline attach`), the library waits
    // for its entry point (hooks/attach.rs).
    if !runtime::lifecycle::loaded_by_preload() {
        return;
    }
    runtime::lifecycle::init(hooks::resolve, hooks::attach::own_hooks);
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
//
// Two unwinders then live in a process that uses C++: the program's and the
// agent's copy, and an exception the program throws through an agent frame
// that has something to clean up (a drop guard) is driven by the first while
// Rust's personality routine and the landing pad's `_Unwind_Resume` reach
// the second. The two share the context layout, but `_Unwind_SetGR` reads a
// table of register sizes each copy fills the first time it unwinds, and the
// agent's copy had never unwound: it asserted and aborted the program
// (`alloc_failures.cpp`'s throwing new-handler). `prepare_unwinder` makes
// the agent's copy fill it at start.
use core::ffi::{c_int, c_void};

#[link(name = "gcc_eh", kind = "static")]
extern "C" {
    fn _Unwind_Backtrace(
        trace: extern "C" fn(context: *mut c_void, arg: *mut c_void) -> c_int,
        arg: *mut c_void,
    ) -> c_int;
}

/// Stops a backtrace at its first frame (any value but `_URC_NO_REASON`).
extern "C" fn stop_at_first_frame(_context: *mut c_void, _arg: *mut c_void) -> c_int {
    1
}

/// Has the agent's unwinder set itself up (its register-size table), by
/// starting a backtrace and stopping it at once: a few microseconds, once
/// per process.
pub(crate) fn prepare_unwinder() {
    // SAFETY: a backtrace of this thread with a callback that reads nothing.
    unsafe { _Unwind_Backtrace(stop_at_first_frame, core::ptr::null_mut()) };
}
