//! Everything specific to the CPU architecture: reading the registers an
//! unwinder starts from, and the unwinder types. aarch64 adds a sibling module.

#[cfg(target_arch = "x86_64")]
mod x86_64;
#[cfg(target_arch = "x86_64")]
pub use x86_64::*;
/// Inline patching: relocating a function's first instructions.
#[cfg(target_arch = "x86_64")]
#[path = "detour_x86_64.rs"]
pub mod detour;

#[cfg(not(target_arch = "x86_64"))]
compile_error!("trapline's agent supports x86_64 only so far; add src/arch/<arch>.rs");
