//! Records a statically linked program, which has no dynamic loader to
//! preload the agent into, from outside: the recorder starts it under
//! ptrace, detours its allocator's entry points (as the agent detours an
//! allocator linked into an executable) to stubs that stop the thread with
//! an `int3` at the call and at its return, and writes the same trace
//! events the agent writes, with stacks unwound through the process's
//! memory. At `exit` every thread is stopped and the live blocks are
//! judged by the agent's reachability scan (`trapline_reach`), reading the
//! process's memory.
//!
//! Each allocation costs two stops of the calling thread (two round trips
//! through the kernel and this process), so this is far slower than the
//! agent: it is for programs nothing else can record.

#![forbid(unsafe_code)]

mod elf;
pub mod launch;
mod prologue_x86_64;
mod remote;
mod scan;
mod stubs;
mod tracing;
mod unwind;

pub use launch::{traceme_and_exec, TRACEME_ARG};
pub use tracing::{record, Ended, Outcome, Request};
