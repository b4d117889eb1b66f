//! The process's mappings, from /proc/self/maps, read before the world stops.

pub use trapline_reach::maps::{containing, Mapping, Special};

/// Reads and parses the process's maps (allocates: call before stopping
/// threads). Through /proc/thread-self: once the main thread has left
/// through pthread_exit, /proc/self is its zombie's, and reads no mappings.
pub fn read() -> Vec<Mapping> {
    let Ok(text) =
        std::fs::read("/proc/thread-self/maps").or_else(|_| std::fs::read("/proc/self/maps"))
    else {
        return Vec::new();
    };
    text.split(|&b| b == b'\n')
        .filter_map(trapline_reach::maps::parse)
        .collect()
}
