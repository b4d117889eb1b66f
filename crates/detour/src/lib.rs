//! Plans a detour of a function entry that no import slot reaches (an
//! allocator linked into an executable, or a statically linked program's
//! C library): pure computation on the function's bytes, so the agent
//! (patching its own process) and the static-program recorder (patching a
//! stopped child through ptrace) share it. Writing the bytes, and choosing
//! a page within reach, is the caller's part.
//!
//! The function's first whole instructions, at least the 5 bytes of a
//! `jmp rel32`, are decoded (iced-x86) and re-encoded for the trampoline's
//! address (the block encoder rewrites rip-relative operands and relative
//! branches), followed by an absolute jump back to the first instruction
//! not moved. Then comes a stub, an absolute jump to the hook; the
//! function's entry becomes a `jmp rel32` to that stub. Calling the
//! trampoline is calling the original function.
//!
//! Refused: bytes that do not decode, a function that returns or jumps away
//! before 5 bytes, a branch among the moved instructions whose target is
//! inside them, a page out of reach of a `jmp rel32`.

#![forbid(unsafe_code)]

pub mod x86_64;

pub use x86_64::{plan, Detour, Refusal, REACH, READ};
