//! What an allocator call's arguments say: the size and alignment asked
//! for, and whether a release matches the block it releases.

use trapline_trace::{AllocFn, ErrorKind, Event, Family};

use crate::heap::{Block, Freed};

/// The size and alignment an allocating call asked for, from its first
/// three arguments.
pub fn size_and_align(func: AllocFn, [arg0, arg1, arg2]: [u64; 3]) -> (u64, u64) {
    match func {
        AllocFn::Calloc => (arg0.saturating_mul(arg1), 0),
        AllocFn::Realloc => (arg1, 0),
        AllocFn::ReallocArray => (arg1.saturating_mul(arg2), 0),
        AllocFn::PosixMemalign => (arg2, arg1),
        AllocFn::AlignedAlloc | AllocFn::Memalign => (arg1, arg0),
        f if f.cxx_aligned() => (arg0, arg1),
        _ => (arg0, 0),
    }
}

/// How a release does not match its block, as the agent judges it: another
/// family (`free` of a `new` block), a sized release stating another size,
/// or C++ alignment that differs; with what the release gave for the last
/// two. `rsi` and `rdx`: the release's second and third arguments.
pub fn mismatch(func: AllocFn, block: Block, rsi: u64, rdx: u64) -> Option<(ErrorKind, u64)> {
    if block.func.family() != func.family() {
        return Some((ErrorKind::MismatchedFree, 0));
    }
    let (size, align) = match func {
        AllocFn::DeleteSized | AllocFn::DeleteArraySized => (Some(rsi), 0),
        AllocFn::DeleteSizedAligned | AllocFn::DeleteArraySizedAligned => (Some(rsi), rdx),
        f if f.cxx_aligned() => (None, rsi),
        _ => (None, 0),
    };
    if let Some(size) = size.filter(|&s| s != block.size) {
        return Some((ErrorKind::MismatchedSize, size));
    }
    let cxx = func.family() != Family::Malloc;
    (cxx && func.cxx_aligned() != block.func.cxx_aligned())
        .then_some((ErrorKind::MismatchedAlignment, align))
}

/// The `Error` event of a misused call; `known`: the block's allocation
/// (and its release, when freed before).
#[allow(clippy::too_many_arguments)]
pub fn error_event(
    time: u64,
    kind: ErrorKind,
    func: AllocFn,
    addr: u64,
    stack: u32,
    known: Option<Freed>,
    passed_on: bool,
    given: u64,
) -> Event {
    Event::Error {
        time,
        kind,
        func,
        addr,
        stack,
        alloc_func: known.map(|f| f.block.func),
        alloc_size: known.map_or(0, |f| f.block.size),
        alloc_stack: known.map_or(0, |f| f.block.stack),
        free_stack: known.map_or(0, |f| f.free_stack),
        passed_on,
        given,
    }
}
