//! Which live blocks a program can still reach, with memcheck's semantics:
//! shared by the agent (its own process, with the world stopped) and the
//! static-program recorder (a stopped process read from outside). What
//! reads memory and where buffers come from is the caller's
//! ([`Memory`], [`Buffers`]); this crate is the decision.

#![forbid(unsafe_code)]

pub mod arena;
pub mod blocks;
pub mod jemalloc;
pub mod maps;
pub mod mark;
pub mod roots;

pub use blocks::{BlockIndex, Buffers, PlainBuffers, Sieve, Span};
pub use mark::{Marker, Memory};
