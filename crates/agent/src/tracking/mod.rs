//! Which blocks are live (the live table), what the agent does not track,
//! and which mappings belong to allocators.

pub mod access;
pub mod allocator_maps;
pub mod live;
pub mod sampled;
pub mod untracked;
